package serve_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/secretvolume"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
)

// servingVolume writes a serving certificate for istiod.istio-system.svc
// issued by issuer at now as the next version of the Secret volume in dir
// (tls.crt, tls.key), and returns its leaf.
func servingVolume(t *testing.T, dir string, issuer *testca.CA, now time.Time, ttl time.Duration) *x509.Certificate {
	t.Helper()
	c, err := keymgr.IssueServing(issuer.Authority(), keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc"}, Now: now, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pemutil.EncodePrivateKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	var chain []byte
	for _, der := range c.Certificate {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, pemutil.EncodeCertificates(cert)...)
	}
	if err := secretvolume.Write(dir, map[string][]byte{"tls.crt": chain, "tls.key": key}); err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// servingDir is a fresh Secret volume holding a serving certificate of
// issuer's, valid now.
func servingDir(t *testing.T, issuer *testca.CA) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "serving")
	servingVolume(t, dir, issuer, time.Now(), time.Hour)
	return dir
}

// externalServing is the configuration of an external backend under
// issuer's root, serving the certificate in the volume dir.
func externalServing(t *testing.T, issuer *testca.CA, dir string) serve.Config {
	c := config(t)
	if os.Getenv("DEBUGLOG") != "" {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	c.Backend = serve.Backend{External: &external{name: "cfssl", issuer: issuer}, TrustAnchors: []*x509.Certificate{issuer.Root().Cert},
		ServingCertFile: filepath.Join(dir, "tls.crt"), ServingKeyFile: filepath.Join(dir, "tls.key")}
	return c
}

// handshake is the serving certificate a new TLS connection to p's gRPC
// port gets, verified as ztunnel verifies it.
func handshake(t *testing.T, p *serve.Parts, root *x509.Certificate) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", p.Addresses().GRPC, &tls.Config{RootCAs: certs.Pool(root), ServerName: "istiod.istio-system.svc",
		NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

func readyzOf(t *testing.T, p *serve.Parts) (int, string) {
	t.Helper()
	r, err := http.Get("http://" + p.Addresses().Admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(body)
}

// TestAssembleFollowsServingFiles: with an external backend, the
// operator's serving certificate is followed: an expired replacement is
// refused (counted, /readyz says so, still ready) while the last good one
// serves; a renewed one is what the next handshakes get, and the expiry
// gauge follows it.
func TestAssembleFollowsServingFiles(t *testing.T) {
	root := testca.NewRoot(t, "corp root", testca.Options{})
	issuer := root.NewIntermediate(t, "corp intermediate", testca.Options{})
	dir := filepath.Join(t.TempDir(), "serving")
	first := servingVolume(t, dir, issuer, time.Now(), time.Hour)
	p := start(t, externalServing(t, issuer, dir))
	if got := handshake(t, p, root.Cert); !got.Equal(first) {
		t.Fatalf("first handshake got serial %x, want %x", got.SerialNumber, first.SerialNumber)
	}
	m := metrics(t, p)
	for _, want := range []string{
		fmt.Sprintf("meshca_serving_certificate_expiry_timestamp_seconds %s", promFloat(first.NotAfter.Unix())),
		fmt.Sprintf("meshca_serving_certificate_not_before_timestamp_seconds %s", promFloat(first.NotBefore.Unix())),
		`meshca_serving_certificate_reloads_total{result="reloaded"} 0`,
		`meshca_serving_certificate_reloads_total{result="expired"} 0`,
		"meshca_serving_certificate_reload_failing 0",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, body := readyzOf(t, p); code != 200 || !strings.Contains(body, "[+]serving-cert ok\n") {
		t.Errorf("/readyz %d:\n%s", code, body)
	}

	servingVolume(t, dir, issuer, time.Now().Add(-3*time.Hour), time.Hour)
	// The gauge, then the counter: both within a look.
	eventually(t, 10*time.Second, "the expired replacement refused and counted", func() bool {
		m := metrics(t, p)
		return strings.Contains(m, "\nmeshca_serving_certificate_reload_failing 1\n") &&
			strings.Contains(m, `meshca_serving_certificate_reloads_total{result="expired"} 1`)
	})
	code, body := readyzOf(t, p)
	if want := "[+]serving-cert ok: serving the last good certificate, which expires at " + first.NotAfter.UTC().Format(time.RFC3339) +
		"; its files hold a pair that is refused: keymgr: serving certificate " + filepath.Join(dir, "tls.crt") + ": expired at "; code != 200 || !strings.Contains(body, want) {
		t.Errorf("/readyz %d, want 200 saying %q:\n%s", code, want, body)
	}
	if got := handshake(t, p, root.Cert); !got.Equal(first) {
		t.Fatalf("with an expired replacement, a handshake got serial %x, want the last good %x", got.SerialNumber, first.SerialNumber)
	}

	renewed := servingVolume(t, dir, issuer, time.Now(), 2*time.Hour)
	eventually(t, 10*time.Second, "the renewed certificate served", func() bool { return handshake(t, p, root.Cert).Equal(renewed) })
	m = metrics(t, p)
	for _, want := range []string{
		fmt.Sprintf("meshca_serving_certificate_expiry_timestamp_seconds %s", promFloat(renewed.NotAfter.Unix())),
		`meshca_serving_certificate_reloads_total{result="reloaded"} 1`,
		"meshca_serving_certificate_reload_failing 0",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "meshca_serving_certificate_"))
		}
	}
	if code, body := readyzOf(t, p); code != 200 || !strings.Contains(body, "[+]serving-cert ok\n") {
		t.Errorf("/readyz %d after the renewal:\n%s", code, body)
	}
}

// TestAssembleServingFilesRefusals: the first serving certificate must
// serve; one that cannot stops the assembly, naming the flag and why.
func TestAssembleServingFilesRefusals(t *testing.T) {
	root := testca.NewRoot(t, "corp root", testca.Options{})
	issuer := root.NewIntermediate(t, "corp intermediate", testca.Options{})
	stranger := testca.NewRoot(t, "another CA", testca.Options{})
	for _, tt := range []struct {
		name  string
		write func(dir string)
		msg   string
	}{
		{"expired", func(dir string) { servingVolume(t, dir, issuer, time.Now().Add(-3*time.Hour), time.Hour) }, ": expired at "},
		{"another CA", func(dir string) { servingVolume(t, dir, stranger, time.Now(), time.Hour) }, "does not chain to the trust bundle"},
		{"no files", func(string) {}, "no such file or directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "serving")
			tt.write(dir)
			_, err := serve.Assemble(context.Background(), externalServing(t, issuer, dir))
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != "serving-cert-file" || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want a FieldError for serving-cert-file saying %q", err, tt.msg)
			}
		})
	}
}

// promFloat is how the exposition format writes a whole number of
// seconds.
func promFloat(v int64) string { return strconv.FormatFloat(float64(v), 'g', -1, 64) }

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
