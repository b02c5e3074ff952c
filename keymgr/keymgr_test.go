package keymgr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

// pluggedCA writes root → intermediate in the cacerts layout and returns
// the directory.
func pluggedCA(t *testing.T) (string, *testca.CA) {
	t.Helper()
	root := testca.NewRoot(t, "plugged root", testca.Options{})
	inter := root.NewIntermediate(t, "plugged intermediate", testca.Options{})
	dir := t.TempDir()
	keyPEM, _ := pemutil.EncodePrivateKey(inter.Key)
	write(t, dir, keymgr.FileCACert, pemutil.EncodeCertificates(inter.Cert))
	write(t, dir, keymgr.FileCAKey, keyPEM)
	write(t, dir, keymgr.FileCertChain, pemutil.EncodeCertificates(inter.Cert, root.Cert))
	write(t, dir, keymgr.FileRootCert, pemutil.EncodeCertificates(root.Cert))
	return dir, inter
}

func write(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadCACerts(t *testing.T) {
	other := testca.NewRoot(t, "other root", testca.Options{})
	expired := other.NewIntermediate(t, "expired", testca.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	leafish := other.NewIntermediate(t, "not a ca", testca.Options{NotCA: true})
	otherKey, _ := pemutil.EncodePrivateKey(other.Key)
	tests := []struct {
		name     string
		mutate   func(t *testing.T, dir string)
		wantFile string
		wantErr  string
	}{
		{name: "valid"},
		{name: "chain without root", mutate: func(t *testing.T, dir string) {
			ca, _ := os.ReadFile(filepath.Join(dir, keymgr.FileCACert))
			write(t, dir, keymgr.FileCertChain, ca)
		}},
		{name: "no chain file", mutate: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, keymgr.FileCertChain))
		}},
		{name: "signed by an unrelated CA", mutate: func(t *testing.T, dir string) {
			ca, _ := os.ReadFile(filepath.Join(dir, keymgr.FileCACert))
			write(t, dir, keymgr.FileCertChain, ca)
			write(t, dir, keymgr.FileRootCert, pemutil.EncodeCertificates(other.Cert))
		}, wantFile: keymgr.FileCACert, wantErr: "does not chain to a root"},
		{name: "key mismatch", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileCAKey, otherKey)
		}, wantFile: keymgr.FileCAKey, wantErr: "does not match the public key"},
		{name: "key missing", mutate: func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, keymgr.FileCAKey))
		}, wantFile: keymgr.FileCAKey, wantErr: "no such file"},
		{name: "key garbage", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileCAKey, []byte("nope"))
		}, wantFile: keymgr.FileCAKey, wantErr: "no PEM data"},
		{name: "expired signing cert", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileCACert, pemutil.EncodeCertificates(expired.Cert))
		}, wantFile: keymgr.FileCACert, wantErr: "expired"},
		{name: "signing cert not a CA", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileCACert, pemutil.EncodeCertificates(leafish.Cert))
		}, wantFile: keymgr.FileCACert, wantErr: "not a CA"},
		{name: "wrong root", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileRootCert, pemutil.EncodeCertificates(other.Cert))
		}, wantFile: keymgr.FileCertChain, wantErr: "which the roots file does not hold"},
		{name: "root not self-signed", mutate: func(t *testing.T, dir string) {
			ca, _ := os.ReadFile(filepath.Join(dir, keymgr.FileCACert))
			write(t, dir, keymgr.FileRootCert, ca)
		}, wantFile: keymgr.FileRootCert, wantErr: "not self-issued"},
		{name: "roots garbage", mutate: func(t *testing.T, dir string) {
			write(t, dir, keymgr.FileRootCert, []byte("garbage"))
		}, wantFile: keymgr.FileRootCert, wantErr: "not PEM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, inter := pluggedCA(t)
			if tt.mutate != nil {
				tt.mutate(t, dir)
			}
			a, err := keymgr.LoadCACerts(dir, time.Now())
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !a.Cert.Equal(inter.Cert) || len(a.Chain) != 0 || len(a.Roots) != 1 {
					t.Fatalf("loaded %d chain, %d roots", len(a.Chain), len(a.Roots))
				}
				if got := a.Intermediates(); len(got) != 1 || !got[0].Equal(inter.Cert) {
					t.Fatal("the signing intermediate must be sent with leaves")
				}
				return
			}
			var fe *keymgr.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a FileError", err)
			}
			if filepath.Base(fe.Path) != tt.wantFile || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want file %s and %q", err, tt.wantFile, tt.wantErr)
			}
		})
	}
}

func TestLoadCACertsTLSLayout(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	mid := root.NewIntermediate(t, "mid", testca.Options{})
	sign := mid.NewIntermediate(t, "signing", testca.Options{})
	dir := t.TempDir()
	keyPEM, _ := pemutil.EncodePrivateKey(sign.Key)
	write(t, dir, keymgr.FileTLSCert, pemutil.EncodeCertificates(sign.Cert, mid.Cert))
	write(t, dir, keymgr.FileTLSKey, keyPEM)
	write(t, dir, keymgr.FileTLSCA, pemutil.EncodeCertificates(root.Cert))
	a, err := keymgr.LoadCACerts(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := a.Intermediates()
	if len(got) != 2 || !got[0].Equal(sign.Cert) || !got[1].Equal(mid.Cert) {
		t.Fatalf("intermediates = %d certs, want signing then mid", len(got))
	}
	if !a.NotAfter().Equal(minTime(sign.Cert.NotAfter, mid.Cert.NotAfter)) {
		t.Fatal("NotAfter must be the earliest expiry on the signing path")
	}
}

func TestLoadCACertsEmptyDir(t *testing.T) {
	_, err := keymgr.LoadCACerts(t.TempDir(), time.Now())
	if err == nil || !strings.Contains(err.Error(), "holds neither") {
		t.Fatalf("err = %v", err)
	}
}

func TestIssueServing(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{NotAfter: time.Now().Add(time.Hour)})
	a := root.Authority()
	c, err := keymgr.IssueServing(a, keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "istiod.istio-system.svc"}); err != nil {
		t.Fatal(err)
	}
	if len(c.Leaf.IPAddresses) != 1 || !c.Leaf.NotAfter.Equal(root.Cert.NotAfter) {
		t.Fatalf("IPs %v NotAfter %v (root %v)", c.Leaf.IPAddresses, c.Leaf.NotAfter, root.Cert.NotAfter)
	}
	if _, err := keymgr.IssueServing(a, keymgr.ServingOptions{}); err == nil {
		t.Fatal("want an error without names")
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestValidateRefusesPathLenForLeaves: a plugged-in intermediate under a
// root with pathlen:0 verifies, but every leaf it signs would be refused
// by every peer: the authority is refused, saying why.
func TestValidateRefusesPathLenForLeaves(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pathlen 0 root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		MaxPathLen: 0, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	root := &testca.CA{Cert: cert, Key: key}
	inter := root.NewIntermediate(t, "issuing", testca.Options{})
	ok := testca.NewRoot(t, "plain root", testca.Options{})
	tests := []struct {
		name string
		a    *keymgr.Authority
		want string
	}{
		{"intermediate under a pathlen:0 root", &keymgr.Authority{Cert: inter.Cert, Key: inter.Key, Roots: []*x509.Certificate{root.Cert}},
			"its leaves would break a path length constraint: CN=pathlen 0 root has pathlen 0, and a leaf of"},
		{"the pathlen:0 root signing itself", &keymgr.Authority{Cert: root.Cert, Key: root.Key, Roots: []*x509.Certificate{root.Cert}}, ""},
		{"intermediate under a plain root", func() *keymgr.Authority {
			i := ok.NewIntermediate(t, "issuing", testca.Options{})
			return &keymgr.Authority{Cert: i.Cert, Key: i.Key, Roots: []*x509.Certificate{ok.Cert}}
		}(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.a.Validate(now)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate: %v, want %q", err, tt.want)
			}
		})
	}
}
