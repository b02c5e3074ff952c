package upstreams

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/upstream"
)

// TestVaultRootPrepare: `meshca root prepare --upstream vault-transit`
// and `--upstream vault-pki`, logged in with the admin policy
// docs/upstream.md gives, make a root in Vault and the lineage's first
// intermediate; the CA state records the root's Ref (the Transit key
// and its version; the issuer's ID) and not its key; a second prepare
// makes another root beside it.
func TestVaultRootPrepare(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	v.MountPKI(t, "pki-mesh")
	_, transitAdmin := v.PolicyToken(t, "meshca-transit-admin", docPolicy(t, "meshca-transit-admin"))
	_, pkiAdmin := v.PolicyToken(t, "meshca-pki-admin", docPolicy(t, "meshca-pki-admin", "pki/", "pki-mesh/"))
	for _, tc := range []struct {
		upstream string
		flags    []string
		key      string // what Ref.Key looks like
	}{
		{"vault-transit", []string{"--vault-token-file", transitAdmin}, "meshca-root-"},
		{"vault-pki", []string{"--vault-token-file", pkiAdmin, "--vault-pki-mount", "pki-mesh"}, "-"},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			for i := range 2 {
				args := append([]string{"root", "prepare", "--state-dir", state, "--upstream", tc.upstream, "--vault-addr", v.Addr,
					"--trust-domain", "cluster.local", "--intermediate-ttl", "24h"}, tc.flags...)
				out, err := exec.Command(bin, args...).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "its root's key is in upstream "+tc.upstream) {
					t.Fatalf("prepare %d: %v\n%s", i+1, err, out)
				}
			}
			out, err := exec.Command(bin, "root", "status", "--state-dir", state, "-o", "json").Output()
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Authorities []struct {
					Upstream *upstream.Ref
					Signing  *struct{ Subject string }
				}
			}
			if err := json.Unmarshal(out, &st); err != nil {
				t.Fatal(err)
			}
			refs := map[upstream.Ref]bool{}
			for _, a := range st.Authorities {
				if a.Upstream == nil || a.Upstream.Type != tc.upstream || !strings.Contains(a.Upstream.Key, tc.key) || a.Signing == nil {
					t.Fatalf("an authority of %s:\n%s", tc.upstream, out)
				}
				refs[*a.Upstream] = true
			}
			if len(st.Authorities) != 2 || len(refs) != 2 {
				t.Fatalf("%d authorities with %d roots in Vault, want 2 and 2:\n%s", len(st.Authorities), len(refs), out)
			}
			loaded, _, err := (&dirstore.Store{Dir: state}).Load(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range loaded.Authorities {
				if a.RootKey != nil {
					t.Fatalf("authority %s keeps its root's key in the CA state", a.ID())
				}
			}
		})
	}
}
