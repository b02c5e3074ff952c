package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	URL string
	cmd *exec.Cmd
	log string
}

// CfsslOptions shape the server's signing policy.
type CfsslOptions struct {
	// AuthKey (hex) makes the default profile require authsign.
	AuthKey string
	// Usages of the default profile; workload usages when nil.
	Usages []string
	// Expiry of the default profile (cfssl's duration syntax); "24h" when empty.
	Expiry string
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
	profile := map[string]any{"usages": o.Usages, "expiry": o.Expiry, "backdate": "2m"}
	cfg := map[string]any{"signing": map[string]any{"default": profile}}
	if o.AuthKey != "" {
		profile["auth_key"] = "meshca"
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
	port := FreePort(tb)
	c := &Cfssl{URL: "http://127.0.0.1:" + strconv.Itoa(port), log: filepath.Join(dir, "cfssl.log")}
	logf, err := os.Create(c.log)
	if err != nil {
		tb.Fatal(err)
	}
	c.cmd = exec.Command(bin, "serve", "-address", "127.0.0.1", "-port", strconv.Itoa(port),
		"-ca", filepath.Join(dir, "ca.pem"), "-ca-key", filepath.Join(dir, "ca-key.pem"), "-config", filepath.Join(dir, "config.json"))
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		tb.Fatalf("start cfssl serve: %v", err)
	}
	tb.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		logf.Close()
		if tb.Failed() {
			b, _ := os.ReadFile(c.log)
			tb.Logf("cfssl serve log:\n%s", b)
		}
	})
	if err := waitTCP(fmt.Sprintf("127.0.0.1:%d", port), 15*time.Second); err != nil {
		b, _ := os.ReadFile(c.log)
		tb.Fatalf("cfssl serve did not listen: %v\n%s", err, b)
	}
	return c
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitTCP(addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		if ctx.Err() != nil || strings.Contains(err.Error(), "operation was canceled") {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
