//go:build pkcs11

package pkcs11

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/softhsm"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// hsm is this test binary's SoftHSM2 configuration: SoftHSM2 reads
// SOFTHSM2_CONF when the module initialises, so every test makes its own
// token in one directory.
var hsm *softhsm.Dir

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if err := softhsm.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real SoftHSM2 is required for the pkcs11 tests:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "meshca-softhsm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if hsm, err = softhsm.NewDir(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv(softhsm.ConfEnv, hsm.Conf)
	return m.Run()
}

const (
	testPIN   = "4711-user"
	testSOPIN = "4711-so"
)

var tokens atomic.Int64

// newToken initialises a token of its own for t and returns the
// configuration that logs in to it.
func newToken(t *testing.T) Config {
	t.Helper()
	label := fmt.Sprintf("meshca-test-%d", tokens.Add(1))
	if err := hsm.InitToken(label, testPIN, testSOPIN); err != nil {
		t.Fatal(err)
	}
	return Config{Module: softhsm.Module, TokenLabel: label, PIN: testPIN}
}

// newUpstream is New(cfg), closed at the end of t.
func newUpstream(t *testing.T, cfg Config) *Upstream {
	t.Helper()
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// newRoot makes a root of type kt in u's token.
func newRoot(t *testing.T, u *Upstream, kt certs.KeyType) *upstream.Root {
	t.Helper()
	root, err := u.NewRoot(context.Background(), &upstream.RootRequest{
		KeyType: kt, Subject: pkix.Name{Organization: []string{td.Name()}, CommonName: "pkcs11 test root " + string(kt)},
		TTL: 24 * time.Hour, Now: time.Now(),
	})
	if err != nil {
		t.Fatalf("NewRoot(%s): %v", kt, err)
	}
	return root
}

// request asks for a one-hour intermediate under root.
func request(t *testing.T, root *upstream.Root) *upstream.Request {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	subject := pkix.Name{Organization: []string{td.Name()}, CommonName: "pkcs11 test intermediate"}
	csr, err := upstream.NewCSR(key, subject, td)
	if err != nil {
		t.Fatal(err)
	}
	return &upstream.Request{CSR: csr, Subject: subject, TrustDomain: td, Root: root.Cert, Ref: root.Ref, TTL: time.Hour}
}
