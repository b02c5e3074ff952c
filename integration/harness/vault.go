package harness

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// VaultBinary builds (once, cached outside the clone) the real Vault server.
func VaultBinary() (string, error) {
	cmd := exec.Command("bash", filepath.Join(ScriptsDir(), "vault.sh"), "build")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("harness: build vault: %w", err)
	}
	return lastLine(string(out)), nil
}

// VaultRootToken is the dev server's root token.
const VaultRootToken = "root"

// Vault is a running `vault server -dev` on 127.0.0.1. Its state is in
// memory: a restart comes back empty.
type Vault struct {
	Addr   string
	Client *api.Client
	bin    string
	port   int
	cmd    *exec.Cmd
	log    string
}

// Pid is the server process's id, for reading its CPU time in /proc.
func (v *Vault) Pid() int { return v.cmd.Process.Pid }

// StartVault runs a Vault dev server and stops it at cleanup.
func StartVault(tb testing.TB, bin string) *Vault {
	tb.Helper()
	v := &Vault{bin: bin, log: filepath.Join(tb.TempDir(), "vault.log")}
	v.Start(tb)
	tb.Cleanup(func() {
		v.Stop()
		if tb.Failed() {
			b, _ := os.ReadFile(v.log)
			tb.Logf("vault log (tail):\n%s", tail(string(b), 40))
		}
	})
	return v
}

// Start (re)starts the server on its port.
func (v *Vault) Start(tb testing.TB) {
	tb.Helper()
	logf, err := os.OpenFile(v.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	// The first start lets the kernel pick the port; restarts keep it,
	// since meshca and the tests know Vault by its address.
	v.cmd = exec.Command(v.bin, "server", "-dev", "-dev-root-token-id="+VaultRootToken, "-dev-no-store-token",
		"-dev-listen-address=127.0.0.1:"+strconv.Itoa(v.port))
	v.cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + os.TempDir()}
	v.cmd.Stdout, v.cmd.Stderr = logf, logf
	if err := v.cmd.Start(); err != nil {
		tb.Fatalf("start vault: %v", err)
	}
	fail := func(err error) {
		b, _ := os.ReadFile(v.log)
		tb.Fatalf("vault did not become ready: %v\n%s", err, tail(string(b), 30))
	}
	deadline := time.Now().Add(30 * time.Second)
	if v.port == 0 {
		// Vault may listen twice, its API and its cluster port; the API is
		// the one that answers HTTP.
		for {
			ports, err := listeningPorts(v.cmd.Process.Pid)
			if err == nil {
				if v.port, err = apiPort(ports); err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				fail(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		v.Addr = "http://127.0.0.1:" + strconv.Itoa(v.port)
		cfg := api.DefaultConfig()
		cfg.Address = v.Addr
		c, err := api.NewClient(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		c.SetToken(VaultRootToken)
		v.Client = c
	}
	for {
		h, err := v.Client.Sys().HealthWithContext(context.Background())
		if err == nil && h.Initialized && !h.Sealed {
			return
		}
		if time.Now().After(deadline) {
			fail(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apiPort is the one of ports that answers Vault's HTTP health endpoint.
func apiPort(ports []int) (int, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, p := range ports {
		r, err := client.Get("http://127.0.0.1:" + strconv.Itoa(p) + "/v1/sys/health")
		if err != nil {
			continue
		}
		var h struct {
			Initialized *bool `json:"initialized"`
		}
		err = json.NewDecoder(r.Body).Decode(&h)
		r.Body.Close()
		if err == nil && h.Initialized != nil {
			return p, nil
		}
	}
	return 0, fmt.Errorf("none of Vault's ports %v answers HTTP", ports)
}

// Stop stops the server and waits for it to exit.
func (v *Vault) Stop() {
	if v.cmd == nil || v.cmd.Process == nil {
		return
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = v.cmd.Process.Kill()
		<-done
	}
	v.cmd = nil
}

// The roles ConfigurePKI creates: VaultMainRole for EC and Ed25519 keys,
// VaultRSARole for RSA keys (vault.Config.Role and KeyEnciphermentRole),
// VaultIstiodRole for istiod's DNS certificate (vault.Config.DNSRole).
const (
	VaultMainRole   = "mesh"
	VaultRSARole    = "mesh-rsa"
	VaultIstiodRole = "istiod"
)

// IstiodDNSNames are the names VaultIstiodRole allows and StartCfssl's
// CfsslIstiodProfile is used for: istiod's, and a revision's.
var IstiodDNSNames = []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}

// VaultRole holds the role settings a test varies.
type VaultRole struct {
	AllowedURISANs string // both roles; default spiffe://cluster.local/*
	KeyUsage       string // VaultMainRole's; default DigitalSignature
	NotBefore      string // both roles' not_before_duration; default 120s
}

// ConfigurePKI mounts a PKI engine at mount, imports a as its issuer
// (truncating leaves at the issuer's expiry) and creates the roles
// docs/signers/vault.md documents: VaultMainRole and VaultRSARole, with
// key_usage DigitalSignature and DigitalSignature,KeyEncipherment.
func (v *Vault) ConfigurePKI(tb testing.TB, mount string, a *keymgr.Authority, r VaultRole) {
	tb.Helper()
	ctx := context.Background()
	v.MountPKI(tb, mount)
	keyPEM, err := pemutil.EncodePrivateKey(a.Key)
	if err != nil {
		tb.Fatal(err)
	}
	bundle := string(pemutil.EncodeCertificates(append([]*x509.Certificate{a.Cert}, a.Chain...)...)) + string(keyPEM)
	if _, err := v.Client.Logical().WriteWithContext(ctx, mount+"/config/ca", map[string]any{"pem_bundle": bundle}); err != nil {
		tb.Fatalf("import CA into %s: %v", mount, err)
	}
	if _, err := v.Client.Logical().WriteWithContext(ctx, mount+"/issuer/default", map[string]any{"leaf_not_after_behavior": "truncate"}); err != nil {
		tb.Fatalf("issuer settings: %v", err)
	}
	v.ConfigureRoles(tb, mount, r)
}

// MountPKI mounts a PKI engine, with no issuer, at mount.
func (v *Vault) MountPKI(tb testing.TB, mount string) {
	tb.Helper()
	if err := v.Client.Sys().MountWithContext(context.Background(), mount, &api.MountInput{Type: "pki", Config: api.MountConfigInput{MaxLeaseTTL: "87600h"}}); err != nil {
		tb.Fatalf("mount %s: %v", mount, err)
	}
}

// MountTransit mounts a Transit secrets engine at mount.
func (v *Vault) MountTransit(tb testing.TB, mount string) {
	tb.Helper()
	if err := v.Client.Sys().MountWithContext(context.Background(), mount, &api.MountInput{Type: "transit"}); err != nil {
		tb.Fatalf("mount %s: %v", mount, err)
	}
}

// PolicyToken creates the ACL policy name from hcl and returns a token
// that holds it (and Vault's default policy, for lookup-self), written to
// a file of its own for a vaultauth.TokenFile login.
func (v *Vault) PolicyToken(tb testing.TB, name, hcl string) (token, file string) {
	tb.Helper()
	ctx := context.Background()
	if err := v.Client.Sys().PutPolicyWithContext(ctx, name, hcl); err != nil {
		tb.Fatalf("policy %s: %v", name, err)
	}
	s, err := v.Client.Auth().Token().CreateWithContext(ctx, &api.TokenCreateRequest{Policies: []string{name}, TTL: "2h"})
	if err != nil {
		tb.Fatalf("token for %s: %v", name, err)
	}
	file = filepath.Join(tb.TempDir(), name+".token")
	if err := os.WriteFile(file, []byte(s.Auth.ClientToken), 0o600); err != nil {
		tb.Fatal(err)
	}
	return s.Auth.ClientToken, file
}

// ConfigureRoles creates the roles docs/signers/vault.md documents in
// mount: VaultMainRole and VaultRSARole, signing with the default issuer.
func (v *Vault) ConfigureRoles(tb testing.TB, mount string, r VaultRole) {
	tb.Helper()
	ctx := context.Background()
	if r.AllowedURISANs == "" {
		r.AllowedURISANs = "spiffe://cluster.local/*"
	}
	if r.KeyUsage == "" {
		r.KeyUsage = "DigitalSignature"
	}
	if r.NotBefore == "" {
		r.NotBefore = "120s"
	}
	roles := map[string]map[string]any{
		VaultMainRole: {"key_type": "any", "key_usage": r.KeyUsage},
		VaultRSARole:  {"key_type": "rsa", "key_bits": 2048, "key_usage": "DigitalSignature,KeyEncipherment"},
	}
	for role, settings := range roles {
		// No subject fields (ou, organization, ...): the subject stays empty.
		maps.Copy(settings, map[string]any{
			"allowed_uri_sans": r.AllowedURISANs, "allow_any_name": false, "enforce_hostnames": false,
			"require_cn": false, "use_csr_sans": false, "use_csr_common_name": false,
			"ext_key_usage": "ServerAuth,ClientAuth", "basic_constraints_valid_for_non_ca": true, "no_store": true,
			"ttl": "24h", "max_ttl": "24h", "not_before_duration": r.NotBefore,
		})
		if _, err := v.Client.Logical().WriteWithContext(ctx, mount+"/roles/"+role, settings); err != nil {
			tb.Fatalf("role %s: %v", role, err)
		}
	}
	// istiod's role, as docs/signers/vault.md gives it: exactly its DNS
	// names, nothing from the CSR, no URI SAN.
	istiod := map[string]any{
		"allowed_domains": strings.Join(IstiodDNSNames, ","), "allow_bare_domains": true, "allow_subdomains": false,
		"allow_glob_domains": false, "allow_any_name": false, "allow_localhost": false, "allow_ip_sans": false,
		"allowed_uri_sans": "", "require_cn": false, "use_csr_sans": false, "use_csr_common_name": false,
		"key_type": "any", "key_usage": "DigitalSignature", "ext_key_usage": "ServerAuth,ClientAuth",
		"basic_constraints_valid_for_non_ca": true, "no_store": true, "ttl": "24h", "max_ttl": "24h", "not_before_duration": r.NotBefore,
	}
	if _, err := v.Client.Logical().WriteWithContext(ctx, mount+"/roles/"+VaultIstiodRole, istiod); err != nil {
		tb.Fatalf("role %s: %v", VaultIstiodRole, err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var unsealKeyLine = regexp.MustCompile(`Unseal Key: (\S+)`)

// UnsealKey is the dev server's unseal key, from its log.
func (v *Vault) UnsealKey(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(v.log)
	if err != nil {
		tb.Fatal(err)
	}
	m := unsealKeyLine.FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		tb.Fatal("no unseal key in the vault log")
	}
	return m[len(m)-1][1]
}

// VaultAudit is a file audit device of a Vault: every request Vault
// handled, by path, as Vault itself logged it.
type VaultAudit struct {
	file string
}

// EnableAudit enables a file audit device writing to a file of the test.
func (v *Vault) EnableAudit(tb testing.TB) *VaultAudit {
	tb.Helper()
	file := filepath.Join(tb.TempDir(), "vault-audit.log")
	if err := v.Client.Sys().EnableAuditWithOptionsWithContext(context.Background(), "file", &api.EnableAuditOptions{
		Type: "file", Options: map[string]string{"file_path": file},
	}); err != nil {
		tb.Fatalf("vault audit device: %v", err)
	}
	return &VaultAudit{file: file}
}

// Mark is where the audit log ends now: Requests counts from there.
func (a *VaultAudit) Mark() int64 {
	st, err := os.Stat(a.file)
	if err != nil {
		return 0
	}
	return st.Size()
}

// Requests counts the requests Vault logged since mark, by path.
func (a *VaultAudit) Requests(mark int64) (map[string]int, error) {
	f, err := os.Open(a.file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(mark, 0); err != nil {
		return nil, err
	}
	counts := map[string]int{}
	dec := json.NewDecoder(f)
	for {
		var e struct {
			Type    string `json:"type"`
			Request struct {
				Path string `json:"path"`
			} `json:"request"`
		}
		if err := dec.Decode(&e); err != nil {
			break // the end, or a line still being written
		}
		if e.Type == "request" {
			counts[e.Request.Path]++
		}
	}
	return counts, nil
}
