package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
)

// CfsslBinary builds (once, cached outside the clone) the real cfssl CLI.
func CfsslBinary() (string, error) {
	out, err := exec.Command("bash", filepath.Join(ScriptsDir(), "cfssl.sh"), "build").Output()
	if err != nil {
		return "", fmt.Errorf("harness: build cfssl: %w", err)
	}
	return lastLine(string(out)), nil
}

// Cfssl is a running `cfssl serve`.
type Cfssl struct {
	URL  string
	Port int
	cmd  *exec.Cmd
	log  string
	once sync.Once
}

// Stop kills the server and waits for it; a second Stop does nothing.
func (c *Cfssl) Stop() {
	c.once.Do(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	})
}

// CfsslRSAProfile is the profile for RSA workload keys that StartCfssl
// configures next to the default profile, the one
// cfssl.RemoteConfig.KeyEnciphermentProfile names.
const CfsslRSAProfile = "rsa"

// CfsslIstiodProfile is the profile for istiod's DNS certificate
// (cfssl.RemoteConfig.DNSProfile): workload usages, and only
// IstiodDNSNames (a name whitelist).
const CfsslIstiodProfile = "istiod"

// CfsslOptions shape the server's signing policy: a default profile and
// CfsslRSAProfile, both taking only the key from a CSR (docs/signers/cfssl.md).
type CfsslOptions struct {
	// AuthKey (hex) makes both profiles require authsign.
	AuthKey string
	// Usages of the default profile; workload usages of EC keys when nil.
	// CfsslRSAProfile has those of RSA keys.
	Usages []string
	// Expiry of both profiles (cfssl's duration syntax); "24h" when empty.
	Expiry string
	// CopySubject leaves the CSR whitelist out, so that cfssl copies a
	// CSR's subject (a misconfiguration meshca refuses).
	CopySubject bool
	// Backdate of both profiles; "2m" when empty.
	Backdate string
	// Port to listen on; the kernel picks one when zero. A test that
	// restarts cfssl with another key (a root rotation) reuses the port.
	Port int
}

// StartCfssl runs `cfssl serve` on 127.0.0.1 signing with a, and stops it
// at cleanup.
func StartCfssl(tb testing.TB, bin string, a *keymgr.Authority, o CfsslOptions) *Cfssl {
	tb.Helper()
	dir := tb.TempDir()
	keyPEM, err := pemutil.EncodePrivateKey(a.Key)
	if err != nil {
		tb.Fatal(err)
	}
	if o.Usages == nil {
		o.Usages = []string{"digital signature", "server auth", "client auth"}
	}
	if o.Expiry == "" {
		o.Expiry = "24h"
	}
	if o.Backdate == "" {
		o.Backdate = "2m"
	}
	profile := func(usages []string) map[string]any {
		p := map[string]any{"usages": usages, "expiry": o.Expiry, "backdate": o.Backdate}
		if !o.CopySubject {
			p["CSRWhitelist"] = map[string]bool{"PublicKey": true, "PublicKeyAlgorithm": true, "SignatureAlgorithm": true}
		}
		if o.AuthKey != "" {
			p["auth_key"] = "meshca"
		}
		return p
	}
	istiod := profile([]string{"digital signature", "server auth", "client auth"})
	istiod["name_whitelist"] = `^istiod(-[a-z0-9-]+)?\.istio-system\.svc$`
	cfg := map[string]any{"signing": map[string]any{
		"default": profile(o.Usages),
		"profiles": map[string]any{
			CfsslRSAProfile:    profile([]string{"digital signature", "key encipherment", "server auth", "client auth"}),
			CfsslIstiodProfile: istiod,
		},
	}}
	if o.AuthKey != "" {
		cfg["auth_keys"] = map[string]any{"meshca": map[string]string{"type": "standard", "key": o.AuthKey}}
	}
	cfgJSON, _ := json.Marshal(cfg)
	for name, data := range map[string][]byte{
		"ca.pem": pemutil.EncodeCertificates(a.Cert), "ca-key.pem": keyPEM, "config.json": cfgJSON,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	c := &Cfssl{log: filepath.Join(dir, "cfssl.log")}
	logf, err := os.Create(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	c.cmd = exec.Command(bin, "serve", "-address", "127.0.0.1", "-port", strconv.Itoa(o.Port),
		"-ca", filepath.Join(dir, "ca.pem"), "-ca-key", filepath.Join(dir, "ca-key.pem"), "-config", filepath.Join(dir, "config.json"))
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		tb.Fatalf("start cfssl serve: %v", err)
	}
	tb.Cleanup(func() {
		c.Stop()
		logf.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(c.log)
			tb.Logf("cfssl serve log:\n%s", b)
		}
	})
	ports, err := waitListening(c.cmd.Process.Pid, 1, 15*time.Second)
	if err != nil {
		b, _ := os.ReadFile(c.log)
		tb.Fatalf("cfssl serve did not listen: %v\n%s", err, b)
	}
	c.Port = ports[0]
	c.URL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	return c
}
