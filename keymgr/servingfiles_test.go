package keymgr_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/secretvolume"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

const servingName = "istiod.istio-system.svc"

// pair is a serving certificate and its key as files hold them.
type pair struct {
	cert, key []byte
	leaf      *x509.Certificate
}

var servingSerial atomic.Int64

// newPair issues, under issuer, a serving certificate for servingName
// with a fresh P-256 key, valid from a minute ago for an hour, for
// server authentication; mutate changes the template first. The chain
// is the leaf, then issuer.
func newPair(t *testing.T, issuer *testca.CA, mutate func(*x509.Certificate)) pair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(servingSerial.Add(1)), Subject: pkix.Name{CommonName: servingName},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), DNSNames: []string{servingName},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.Cert, key.Public(), issuer.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pemutil.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pair{cert: pemutil.EncodeCertificates(leaf, issuer.Cert), key: keyPEM, leaf: leaf}
}

// volume is a Secret volume as the kubelet lays it out
// (secretvolume): tls.crt and tls.key.
type volume struct {
	t   *testing.T
	dir string
}

func newVolume(t *testing.T) *volume { return &volume{t: t, dir: t.TempDir()} }

func (v *volume) certFile() string { return filepath.Join(v.dir, "tls.crt") }
func (v *volume) keyFile() string  { return filepath.Join(v.dir, "tls.key") }

// swap makes p the volume's next version at once, as the kubelet does.
func (v *volume) swap(p pair) {
	v.t.Helper()
	must(v.t, secretvolume.Write(v.dir, map[string][]byte{"tls.crt": p.cert, "tls.key": p.key}))
}

// write writes the files of the current version in place, one after the
// other, as an operator's cp would: what a reader sees in between is a
// half-written pair.
func (v *volume) write(certPEM, keyPEM []byte) {
	v.t.Helper()
	if certPEM != nil {
		must(v.t, os.WriteFile(v.certFile(), certPEM, 0o644))
	}
	if keyPEM != nil {
		must(v.t, os.WriteFile(v.keyFile(), keyPEM, 0o600))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// servingPKI is a root, the intermediate that issues serving
// certificates, and a volume holding a first good pair under it, loaded.
type servingPKI struct {
	root, inter *testca.CA
	vol         *volume
	first       pair
	files       *keymgr.ServingFiles
}

func newServingPKI(t *testing.T) *servingPKI {
	t.Helper()
	root := testca.NewRoot(t, "mesh root", testca.Options{})
	p := &servingPKI{root: root, inter: root.NewIntermediate(t, "serving issuer", testca.Options{}), vol: newVolume(t)}
	p.first = newPair(t, p.inter, nil)
	p.vol.swap(p.first)
	p.files = &keymgr.ServingFiles{CertFile: p.vol.certFile(), KeyFile: p.vol.keyFile(),
		Roots: func() []*x509.Certificate { return []*x509.Certificate{root.Cert} }}
	if changed, err := p.files.Reload(); !changed || err != nil {
		t.Fatalf("first Reload: %v %v", changed, err)
	}
	return p
}

// served is the leaf GetCertificate hands a new handshake.
func served(t *testing.T, f *keymgr.ServingFiles) *x509.Certificate {
	t.Helper()
	c, err := f.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// TestServingFilesFollowsRenewals: a renewed pair swapped in as the
// kubelet swaps a Secret volume serves from the next look; so does one
// that names more, covers the names by a wildcard, or chains through
// another intermediate of the trusted root.
func TestServingFilesFollowsRenewals(t *testing.T) {
	p := newServingPKI(t)
	if got := served(t, p.files); !got.Equal(p.first.leaf) {
		t.Fatalf("serving serial %v, want the first pair's", got.SerialNumber)
	}
	other := p.root.NewIntermediate(t, "next serving issuer", testca.Options{})
	for _, tt := range []struct {
		name string
		next pair
	}{
		{"renewed", newPair(t, p.inter, nil)},
		{"more names", newPair(t, p.inter, func(c *x509.Certificate) {
			c.DNSNames = append(c.DNSNames, "meshca.istio-system.svc")
			c.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		})},
		{"another intermediate", newPair(t, other, func(c *x509.Certificate) {
			c.DNSNames = append(c.DNSNames, "meshca.istio-system.svc")
			c.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		})},
		{"a wildcard", newPair(t, p.inter, func(c *x509.Certificate) {
			c.DNSNames = []string{"*.istio-system.svc"}
			c.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		})},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p.vol.swap(tt.next)
			changed, err := p.files.Reload()
			if !changed || err != nil {
				t.Fatalf("Reload = %v, %v; want the renewed pair in service", changed, err)
			}
			if got := served(t, p.files); !got.Equal(tt.next.leaf) {
				t.Fatalf("serving serial %v, want %v", got.SerialNumber, tt.next.leaf.SerialNumber)
			}
			if changed, err := p.files.Reload(); changed || err != nil || p.files.Refused() != nil {
				t.Fatalf("Reload of the same files = %v, %v (refused %v); want nothing to do", changed, err, p.files.Refused())
			}
		})
	}
}

// TestServingFilesKeepsTheLastGoodPair: a pair that cannot serve is
// refused with its reason and a message saying what is wrong, whether
// the kubelet swapped it in whole or an operator is halfway through
// writing it; the pair in service keeps serving, Refused says why until
// the files hold a good pair again.
func TestServingFilesKeepsTheLastGoodPair(t *testing.T) {
	root := testca.NewRoot(t, "mesh root", testca.Options{})
	inter := root.NewIntermediate(t, "serving issuer", testca.Options{})
	stranger := testca.NewRoot(t, "another CA", testca.Options{})
	expiredInter := root.NewIntermediate(t, "expired issuer", testca.Options{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	good := newPair(t, inter, nil)
	otherKey := newPair(t, inter, nil).key
	tests := []struct {
		name      string
		cert, key []byte // nil: keep that file
		swap      bool   // all at once, as the kubelet; else written in place
		reason    string
		msg       string
	}{
		{name: "half-written certificate", cert: newPair(t, inter, nil).cert[:300], reason: keymgr.ServingUnreadable, msg: "tls.crt: line 1: \"-----BEGIN CERTIFICATE-----\" begins a PEM block that does not decode"},
		{name: "half-written key", key: otherKey[:100], reason: keymgr.ServingUnreadable, msg: "tls.key: line 1: \"-----BEGIN PRIVATE KEY-----\" begins a PEM block that does not decode"},
		{name: "new certificate, old key", cert: newPair(t, inter, nil).cert, reason: keymgr.ServingKeyMismatch,
			msg: "tls.key is not the certificate's"},
		{name: "mismatched key", cert: good.cert, key: otherKey, swap: true, reason: keymgr.ServingKeyMismatch, msg: "is not the certificate's"},
		{name: "empty certificate", cert: []byte{}, reason: keymgr.ServingUnreadable, msg: "no PEM data"},
		{name: "expired", swap: true, reason: keymgr.ServingExpired, msg: "expired at ", cert: nil},
		{name: "not yet valid", swap: true, reason: keymgr.ServingNotYetValid, msg: "not valid before "},
		{name: "another CA", swap: true, reason: keymgr.ServingUntrusted, msg: "does not chain to the trust bundle: x509: certificate signed by unknown authority"},
		{name: "expired intermediate", swap: true, reason: keymgr.ServingUntrusted, msg: `"CN=expired issuer,O=meshca test" in its chain is not valid now`},
		{name: "a CA certificate", swap: true, reason: keymgr.ServingNotServer, msg: `starts with a CA certificate ("CN=serving issuer,O=meshca test")`},
		{name: "client authentication only", swap: true, reason: keymgr.ServingNotServer, msg: "does not allow server authentication"},
		{name: "a name dropped", swap: true, reason: keymgr.ServingNames,
			msg: "lacks istiod.istio-system.svc, which the certificate in service carries"},
	}
	replacements := map[string]pair{
		"expired": newPair(t, inter, func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		}),
		"not yet valid": newPair(t, inter, func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(time.Hour), time.Now().Add(2*time.Hour)
		}),
		"another CA":           newPair(t, stranger, nil),
		"expired intermediate": newPair(t, expiredInter, nil),
		"client authentication only": newPair(t, inter, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}),
		"a name dropped": newPair(t, inter, func(c *x509.Certificate) { c.DNSNames = []string{"meshca.istio-system.svc"} }),
	}
	interKey, err := pemutil.EncodePrivateKey(inter.Key)
	must(t, err)
	replacements["a CA certificate"] = pair{cert: pemutil.EncodeCertificates(inter.Cert, root.Cert), key: interKey}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vol := newVolume(t)
			vol.swap(good)
			files := &keymgr.ServingFiles{CertFile: vol.certFile(), KeyFile: vol.keyFile(),
				Roots: func() []*x509.Certificate { return []*x509.Certificate{root.Cert} }}
			if _, err := files.Reload(); err != nil {
				t.Fatal(err)
			}
			if r, ok := replacements[tt.name]; ok {
				tt.cert, tt.key = r.cert, r.key
			}
			if tt.swap {
				vol.swap(pair{cert: tt.cert, key: tt.key})
			} else {
				vol.write(tt.cert, tt.key)
			}
			changed, err := files.Reload()
			var fe *keymgr.ServingFileError
			if changed || !errors.As(err, &fe) || fe.Reason != tt.reason || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Reload = %v, %v; want a %s refusal saying %q", changed, err, tt.reason, tt.msg)

			}
			if !strings.HasPrefix(err.Error(), "keymgr: serving certificate "+vol.certFile()+": ") {
				t.Errorf("error %q does not name the certificate file", err)
			}
			if got := served(t, files); !got.Equal(good.leaf) {
				t.Fatalf("serving serial %v after a refused pair, want the last good one", got.SerialNumber)
			}
			if files.Refused() == nil || files.Refused().Error() != err.Error() {
				t.Fatalf("Refused() = %v, want %v", files.Refused(), err)
			}
			// Put back, the good pair is in service again: nothing refused.
			vol.swap(good)
			if changed, err := files.Reload(); changed || err != nil || files.Refused() != nil {
				t.Fatalf("good pair back: Reload = %v, %v, Refused %v", changed, err, files.Refused())
			}
		})
	}
}

// TestServingFilesFirstPair: the first pair must serve too, and name
// something a client can verify.
func TestServingFilesFirstPair(t *testing.T) {
	root := testca.NewRoot(t, "mesh root", testca.Options{})
	inter := root.NewIntermediate(t, "serving issuer", testca.Options{})
	for _, tt := range []struct {
		name   string
		pair   pair
		roots  []*x509.Certificate
		reason string
		msg    string
	}{
		{"no name", newPair(t, inter, func(c *x509.Certificate) { c.DNSNames = nil }), []*x509.Certificate{root.Cert},
			keymgr.ServingNames, "carries no DNS name or IP address"},
		{"no trust bundle", newPair(t, inter, nil), nil, keymgr.ServingUntrusted, "no trust bundle to verify it against"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			vol := newVolume(t)
			vol.swap(tt.pair)
			files := &keymgr.ServingFiles{CertFile: vol.certFile(), KeyFile: vol.keyFile(), Roots: func() []*x509.Certificate { return tt.roots }}
			_, err := files.Reload()
			var fe *keymgr.ServingFileError
			if !errors.As(err, &fe) || fe.Reason != tt.reason || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Reload = %v, want a %s refusal saying %q", err, tt.reason, tt.msg)
			}
			if _, err := files.GetCertificate(nil); err == nil {
				t.Fatal("GetCertificate served a certificate none was loaded for")
			}
		})
	}
	vol := newVolume(t)
	files := &keymgr.ServingFiles{CertFile: vol.certFile(), KeyFile: vol.keyFile()}
	var fe *keymgr.ServingFileError
	if _, err := files.Reload(); !errors.As(err, &fe) || fe.Reason != keymgr.ServingUnreadable || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no files: %v, want unreadable wrapping ErrNotExist", err)
	}
}

// TestServingFilesRunUnderHandshakes: Run follows the files while TLS
// handshakes go on: every handshake gets a whole pair in service, a
// refused pair is told once (not at every look) however long it stays,
// a connection made before a swap keeps its certificate and one made
// after gets the new one.
func TestServingFilesRunUnderHandshakes(t *testing.T) {
	p := newServingPKI(t)
	var mu sync.Mutex
	var errs []string
	reloaded := make(chan *tls.Certificate, 10)
	p.files.Interval = 5 * time.Millisecond
	p.files.OnError = func(err error) { mu.Lock(); errs = append(errs, err.Error()); mu.Unlock() }
	p.files.OnReload = func(c *tls.Certificate) { reloaded <- c }
	go p.files.Run(t.Context())

	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: p.files.GetCertificate, MinVersion: tls.VersionTLS12})
	must(t, err)
	defer lis.Close()
	go echo(lis)
	roots := x509.NewCertPool()
	roots.AddCert(p.root.Cert)
	dial := func() (*tls.Conn, error) {
		return tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: roots, ServerName: servingName, MinVersion: tls.VersionTLS12})
	}
	// Handshakes all along, each verified against the root.
	var handshakes, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := dial()
				handshakes.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("handshake: %v", err)
					continue
				}
				c.Close()
			}
		})
	}
	before, err := dial()
	must(t, err)
	defer before.Close()

	expired := newPair(t, p.inter, func(c *x509.Certificate) {
		c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	})
	p.vol.swap(expired)
	waitFor(t, func() bool { return p.files.Refused() != nil })
	time.Sleep(20 * p.files.Interval)
	mu.Lock()
	if len(errs) != 1 || !strings.Contains(errs[0], "expired at") {
		t.Errorf("OnError heard %q over 20 looks at one expired pair, want it once", errs)
	}
	mu.Unlock()
	if got := served(t, p.files); !got.Equal(p.first.leaf) {
		t.Fatalf("serving %v, want the first pair while the expired one is refused", got.SerialNumber)
	}

	next := newPair(t, p.inter, nil)
	p.vol.swap(next)
	select {
	case c := <-reloaded:
		if !c.Leaf.Equal(next.leaf) {
			t.Fatalf("OnReload heard serial %v, want %v", c.Leaf.SerialNumber, next.leaf.SerialNumber)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the renewed pair was not put in service")
	}
	after, err := dial()
	must(t, err)
	defer after.Close()
	if got := after.ConnectionState().PeerCertificates[0]; !got.Equal(next.leaf) {
		t.Errorf("a handshake after the swap got serial %v, want %v", got.SerialNumber, next.leaf.SerialNumber)
	}
	if got := before.ConnectionState().PeerCertificates[0]; !got.Equal(p.first.leaf) {
		t.Errorf("a connection from before the swap shows serial %v, want the first", got.SerialNumber)
	}
	if _, err := before.Write([]byte("ping")); err != nil {
		t.Errorf("a connection from before the swap broke: %v", err)
	}
	close(stop)
	wg.Wait()
	if handshakes.Load() == 0 || failed.Load() != 0 {
		t.Errorf("%d handshakes, %d failed; want some and none failed", handshakes.Load(), failed.Load())
	}
	if p.files.Refused() != nil {
		t.Errorf("Refused() = %v with the renewed pair in service", p.files.Refused())
	}
}

// echo accepts connections and copies what each sends back to it.
func echo(lis net.Listener) {
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 64)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}
