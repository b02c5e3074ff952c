package upstreams

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
)

// meshcaRoot runs `meshca root <args>`: its output and exit code.
func meshcaRoot(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"root"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatal(err)
	return "", 0
}

// twoLineages prepares two roots in the upstream, activates the second
// (forced: no leaf was ever issued) and returns the state directory and
// the authority of the first, now previous. The first prepare takes
// first's flags too (an adopted key).
func twoLineages(t *testing.T, flags []string, first ...string) (string, *keymgr.AuthorityRecord) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	for i := range 2 {
		args := append([]string{"prepare", "--state-dir", state, "--trust-domain", "cluster.local", "--intermediate-ttl", "24h"}, flags...)
		if i == 0 {
			args = append(args, first...)
		}
		if out, code := meshcaRoot(t, args...); code != 0 {
			t.Fatalf("prepare: exit %d\n%s", code, out)
		}
	}
	if out, code := meshcaRoot(t, "activate", "--state-dir", state, "--force", "--reason", "test"); code != 0 {
		t.Fatalf("activate: exit %d\n%s", code, out)
	}
	st, _, err := (&dirstore.Store{Dir: state}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range st.Authorities {
		if a.Phase == keymgr.PhasePrevious {
			return state, a
		}
	}
	t.Fatal("no previous authority after activate")
	return "", nil
}

// phaseOf is the phase of authority id in the state directory.
func phaseOf(t *testing.T, state, id string) keymgr.Phase {
	t.Helper()
	st, _, err := (&dirstore.Store{Dir: state}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.View().Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Phase
}

// TestVaultRetireDestroysRootKey: `meshca root retire --destroy-root-key`
// with the destroy policies docs/upstream.md gives. vault-transit: the
// step is refused, the state untouched and the key kept, while the key's
// deletion_allowed is unset, and says what to do; once a Vault operator
// set it, the key is deleted with the step. vault-pki: the issuer meshca
// made and its key are deleted; the new lineage's stay.
func TestVaultRetireDestroysRootKey(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	v.MountPKI(t, "pki-mesh")
	ctx := context.Background()
	root := rootToken(t)
	_, transitDestroy := v.PolicyToken(t, "meshca-transit-destroy", docPolicy(t, "meshca-transit-destroy"))
	_, pkiDestroy := v.PolicyToken(t, "meshca-pki-destroy", docPolicy(t, "meshca-pki-destroy", "pki/", "pki-mesh/"))
	retire := func(state string, flags ...string) (string, int) {
		return meshcaRoot(t, append([]string{"retire", "--state-dir", state, "--force", "--reason", "test", "--destroy-root-key", "--vault-addr", v.Addr}, flags...)...)
	}

	t.Run("vault-transit", func(t *testing.T) {
		state, old := twoLineages(t, []string{"--upstream", "vault-transit", "--vault-addr", v.Addr, "--vault-token-file", root})
		name, _, _ := strings.Cut(old.Upstream.Key, ":")
		out, code := retire(state, "--upstream", "vault-transit", "--vault-token-file", transitDestroy)
		if code != 2 || !strings.Contains(out, "its deletion_allowed is false, and meshca never sets it") || !strings.Contains(out, "vault write transit/keys/"+name+"/config deletion_allowed=true") {
			t.Fatalf("retire --destroy-root-key of a key Vault will not delete: exit %d, want 2 saying why\n%s", code, out)
		}
		t.Logf("retire --destroy-root-key --upstream vault-transit, deletion_allowed unset:\n%s", out)
		if p := phaseOf(t, state, old.ID()); p != keymgr.PhasePrevious {
			t.Fatalf("the refused step left the authority %s", p)
		}
		if s, err := v.Client.Logical().ReadWithContext(ctx, "transit/keys/"+name); err != nil || s == nil {
			t.Fatalf("the refused step deleted the key: %v", err)
		}
		if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/"+name+"/config", map[string]any{"deletion_allowed": true}); err != nil {
			t.Fatal(err)
		}
		out, code = retire(state, "--upstream", "vault-transit", "--vault-token-file", transitDestroy)
		if code != 0 || !strings.Contains(out, "destroyed the root's key "+old.Upstream.Key+" in upstream vault-transit") {
			t.Fatalf("retire --destroy-root-key: exit %d\n%s", code, out)
		}
		if s, err := v.Client.Logical().ReadWithContext(ctx, "transit/keys/"+name); err != nil || s != nil {
			t.Fatalf("transit/keys/%s is still in Vault (%v)", name, err)
		}
		keys, err := v.Client.Logical().ListWithContext(ctx, "transit/keys")
		if err != nil || keys == nil || len(keys.Data["keys"].([]any)) != 1 {
			t.Fatalf("Transit holds %v, want the new root's key alone (%v)", keys, err)
		}
	})

	t.Run("vault-pki", func(t *testing.T) {
		state, old := twoLineages(t, []string{"--upstream", "vault-pki", "--vault-addr", v.Addr, "--vault-token-file", root, "--vault-pki-mount", "pki-mesh"})
		s, err := v.Client.Logical().ReadWithContext(ctx, "pki-mesh/issuer/"+old.Upstream.Key)
		if err != nil || s == nil {
			t.Fatal(err)
		}
		keyID, _ := s.Data["key_id"].(string)
		out, code := retire(state, "--upstream", "vault-pki", "--vault-token-file", pkiDestroy, "--vault-pki-mount", "pki-mesh")
		if code != 0 || !strings.Contains(out, "destroyed the root's key "+old.Upstream.Key+" in upstream vault-pki") {
			t.Fatalf("retire --destroy-root-key: exit %d\n%s", code, out)
		}
		t.Logf("retire --destroy-root-key --upstream vault-pki:\n%s", out)
		if p := phaseOf(t, state, old.ID()); p != keymgr.PhaseRetired {
			t.Fatalf("the authority is %s after retire", p)
		}
		for _, path := range []string{"pki-mesh/issuer/" + old.Upstream.Key, "pki-mesh/key/" + keyID} {
			if s, err := v.Client.Logical().ReadWithContext(ctx, path); err == nil && s != nil {
				t.Fatalf("%s is still in Vault", path)
			}
		}
		issuers, err := v.Client.Logical().ListWithContext(ctx, "pki-mesh/issuers")
		if err != nil || issuers == nil || len(issuers.Data["keys"].([]any)) != 1 {
			t.Fatalf("the mount holds issuers %v, want the new root's alone (%v)", issuers, err)
		}
	})

	// A key an operator named (--vault-transit-key) or an issuer adopted
	// (--vault-pki-issuer) is never meshca's to destroy: refused, kept.
	t.Run("adopted", func(t *testing.T) {
		if _, err := v.Client.Logical().WriteWithContext(ctx, "pki-mesh/root/generate/internal", map[string]any{"common_name": "org root", "issuer_name": "org-root", "key_type": "ec"}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			upstream string
			flags    []string
			adopt    []string
			want     string
		}{
			{"vault-transit", []string{"--vault-token-file", transitDestroy}, []string{"--vault-transit-key", "org-root-key"}, "was named by an operator (--vault-transit-key), not made by meshca"},
			{"vault-pki", []string{"--vault-token-file", pkiDestroy, "--vault-pki-mount", "pki-mesh"}, []string{"--vault-pki-issuer", "org-root"}, `("org-root") was not made by meshca`},
		} {
			login := []string{"--upstream", c.upstream, "--vault-addr", v.Addr, "--vault-token-file", root, "--vault-pki-mount", "pki-mesh"}
			state, old := twoLineages(t, login, c.adopt...)
			out, code := retire(state, append([]string{"--upstream", c.upstream}, c.flags...)...)
			if code != 2 || !strings.Contains(out, c.want) || phaseOf(t, state, old.ID()) != keymgr.PhasePrevious {
				t.Fatalf("%s: retire --destroy-root-key of an adopted key: exit %d, want 2 saying %q, the step not taken\n%s", c.upstream, code, c.want, out)
			}
		}
		if s, err := v.Client.Logical().ReadWithContext(ctx, "transit/keys/org-root-key"); err != nil || s == nil {
			t.Fatalf("the adopted Transit key is gone (%v)", err)
		}
	})
}
