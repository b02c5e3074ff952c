package keymgr

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// Why ServingFiles refused the pair in its files (ServingFileError.Reason);
// each is a metric label value.
const (
	// ServingUnreadable: a file is missing or not one PEM chain or key,
	// as a half-written file is, or the files kept changing while read.
	ServingUnreadable = "unreadable"
	// ServingKeyMismatch: the key is not the certificate's.
	ServingKeyMismatch = "key_mismatch"
	// ServingNotYetValid and ServingExpired: the certificate is not valid
	// now.
	ServingNotYetValid = "not_yet_valid"
	ServingExpired     = "expired"
	// ServingNotServer: a CA certificate first, or one whose extended key
	// usage does not allow server authentication.
	ServingNotServer = "not_server"
	// ServingUntrusted: the chain does not verify to the trust bundle.
	ServingUntrusted = "untrusted"
	// ServingNames: a name the certificate in service carries is missing
	// (or, at start, the certificate names nothing).
	ServingNames = "names"
)

// ServingReasons are every reason, in the order above.
var ServingReasons = []string{ServingUnreadable, ServingKeyMismatch, ServingNotYetValid, ServingExpired, ServingNotServer,
	ServingUntrusted, ServingNames}

// ServingFileError is a pair in ServingFiles' files that was not put in
// service: Reason is one of the Serving* reasons, Err what is wrong.
type ServingFileError struct {
	CertFile string
	Reason   string
	Err      error
}

func (e *ServingFileError) Error() string {
	return fmt.Sprintf("keymgr: serving certificate %s: %v", e.CertFile, e.Err)
}

func (e *ServingFileError) Unwrap() error { return e.Err }

// readTries is how many times a pair is read before files that keep
// changing under the reader are refused as unreadable.
const readTries = 3

// ServingFiles is a serving certificate its owner gives in two PEM files
// (the chain, leaf first, and its key) and renews in place: cert-manager
// rewriting a mounted Secret, which the kubelet swaps at once through its
// ..data symlink, or an operator writing the files one after the other.
// Every Interval it reads both files and, when they hold another pair
// than the one in service, checks it and puts it in service only if the
// key is the certificate's, the certificate is valid now and for server
// authentication, its chain verifies to Roots, and it carries every DNS
// name and IP address of the certificate in service (a client dials one
// of them). Otherwise the last good pair keeps serving, Refused says why
// and OnError hears it, once per distinct failure. New TLS handshakes
// get the pair in service (GetCertificate); established connections keep
// theirs. The package does not log.
type ServingFiles struct {
	CertFile, KeyFile string
	// Roots is the trust bundle a chain must verify to, asked at every
	// check (a CA state's bundle changes as it rotates).
	Roots func() []*x509.Certificate
	// Interval between looks at the files; DefaultFollowInterval when
	// zero.
	Interval time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// OnReload and OnError, when set before Run, hear of every pair put
	// in service and of every distinct failure (a *ServingFileError).
	OnReload func(*tls.Certificate)
	OnError  func(error)

	mu              sync.Mutex // one Reload at a time
	certPEM, keyPEM []byte     // of the pair in service
	current         atomic.Pointer[tls.Certificate]
	refused         atomic.Pointer[ServingFileError]
}

// GetCertificate is a tls.Config.GetCertificate: the pair in service.
func (s *ServingFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.current.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("keymgr: no serving certificate loaded from " + s.CertFile)
}

// Current is the pair in service; nil before the first Reload succeeds.
func (s *ServingFiles) Current() *tls.Certificate { return s.current.Load() }

// Refused is why the files' pair is not in service, while it is not:
// a *ServingFileError, or nil when the files hold the pair in service.
func (s *ServingFiles) Refused() error {
	if e := s.refused.Load(); e != nil {
		return e
	}
	return nil
}

// Reload reads the files and, when they hold another pair than the one in
// service and it passes the checks, puts it in service. It reports whether
// it did; on an error, a *ServingFileError, the pair in service stays. The
// first Reload must succeed for anything to serve.
func (s *ServingFiles) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	certPEM, keyPEM, err := s.read()
	if err == nil && s.current.Load() != nil && bytes.Equal(certPEM, s.certPEM) && bytes.Equal(keyPEM, s.keyPEM) {
		s.refused.Store(nil)
		return false, nil
	}
	var cert *tls.Certificate
	if err == nil {
		cert, err = s.check(certPEM, keyPEM)
	}
	if err != nil {
		var fe *ServingFileError
		if !errors.As(err, &fe) {
			fe = &ServingFileError{CertFile: s.CertFile, Reason: ServingUnreadable, Err: err}
		}
		s.refused.Store(fe)
		return false, fe
	}
	s.certPEM, s.keyPEM = certPEM, keyPEM
	s.current.Store(cert)
	s.refused.Store(nil)
	return true, nil
}

// read reads both files until two reads in a row agree: a pair read
// across a change (the certificate before it, the key after) is read
// again rather than refused.
func (s *ServingFiles) read() (certPEM, keyPEM []byte, err error) {
	for range readTries {
		c1, k1, err := s.readOnce()
		if err != nil {
			return nil, nil, err
		}
		c2, k2, err := s.readOnce()
		if err != nil {
			return nil, nil, err
		}
		if bytes.Equal(c1, c2) && bytes.Equal(k1, k2) {
			return c1, k1, nil
		}
	}
	return nil, nil, fmt.Errorf("%s and %s kept changing while they were read", s.CertFile, s.KeyFile)
}

func (s *ServingFiles) readOnce() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(s.CertFile); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(s.KeyFile); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// check parses the pair and refuses it unless it may serve now.
func (s *ServingFiles) check(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	refuse := func(reason, format string, args ...any) error {
		return &ServingFileError{CertFile: s.CertFile, Reason: reason, Err: fmt.Errorf(format, args...)}
	}
	chain, err := pemutil.ParseCertificates(certPEM)
	if err == nil && len(chain) == 0 {
		err = errors.New("no certificate")
	}
	if err != nil {
		return nil, refuse(ServingUnreadable, "%w", err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, refuse(ServingUnreadable, "key %s: %w", s.KeyFile, err)
	}
	leaf, now := chain[0], s.now()
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(leaf.PublicKey) {
		return nil, refuse(ServingKeyMismatch, "the key in %s is not the certificate's", s.KeyFile)
	}
	switch {
	case now.Before(leaf.NotBefore):
		return nil, refuse(ServingNotYetValid, "not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	case now.After(leaf.NotAfter):
		return nil, refuse(ServingExpired, "expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case leaf.IsCA:
		return nil, refuse(ServingNotServer, "starts with a CA certificate (%q), not the server's own", leaf.Subject.String())
	case len(leaf.ExtKeyUsage) > 0 && !slices.ContainsFunc(leaf.ExtKeyUsage, func(u x509.ExtKeyUsage) bool {
		return u == x509.ExtKeyUsageServerAuth || u == x509.ExtKeyUsageAny
	}):
		return nil, refuse(ServingNotServer, "its extended key usage does not allow server authentication")
	}
	var roots []*x509.Certificate
	if s.Roots != nil {
		roots = s.Roots()
	}
	if err := verifyServing(chain, roots, now); err != nil {
		return nil, refuse(ServingUntrusted, "%w", err)
	}
	if missing := s.missingNames(leaf); missing != "" {
		return nil, refuse(ServingNames, "%s", missing)
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	return &tls.Certificate{Certificate: ders, PrivateKey: key, Leaf: leaf}, nil
}

// verifyServing verifies chain, leaf first, to roots at now, for server
// authentication. Its errors do not change from one look to the next,
// so that a pair that stays refused is reported once.
func verifyServing(chain, roots []*x509.Certificate, now time.Time) error {
	if len(roots) == 0 {
		return errors.New("no trust bundle to verify it against")
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: certs.Pool(roots...), Intermediates: certs.Pool(chain[1:]...),
		CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	var invalid x509.CertificateInvalidError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		// Its Detail names the current time.
		return fmt.Errorf("%q in its chain is not valid now (from %s to %s)", invalid.Cert.Subject.String(),
			invalid.Cert.NotBefore.UTC().Format(time.RFC3339), invalid.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return fmt.Errorf("does not chain to the trust bundle: %w", err)
}

// missingNames says which names of the certificate in service leaf does
// not carry (wildcards count), or, for the first certificate, that it
// carries none; "" when all is well.
func (s *ServingFiles) missingNames(leaf *x509.Certificate) string {
	cur := s.current.Load()
	if cur == nil {
		if len(leaf.DNSNames) == 0 && len(leaf.IPAddresses) == 0 {
			return "it carries no DNS name or IP address for clients to verify"
		}
		return ""
	}
	var missing []string
	for _, n := range cur.Leaf.DNSNames {
		if leaf.VerifyHostname(n) != nil {
			missing = append(missing, n)
		}
	}
	for _, ip := range cur.Leaf.IPAddresses {
		if leaf.VerifyHostname(ip.String()) != nil {
			missing = append(missing, ip.String())
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("it lacks %s, which the certificate in service carries and clients may dial; restart meshca to drop a name",
		strings.Join(missing, ", "))
}

// Run reloads the files every Interval until ctx ends, then returns nil.
// OnError hears of a failure once, until a look succeeds or fails
// otherwise.
func (s *ServingFiles) Run(ctx context.Context) error {
	last := ""
	every(ctx, s.Interval, DefaultFollowInterval, nil, func() {
		changed, err := s.Reload()
		switch {
		case err != nil:
			if err.Error() != last && s.OnError != nil {
				s.OnError(err)
			}
			last = err.Error()
		case changed:
			last = ""
			if s.OnReload != nil {
				s.OnReload(s.current.Load())
			}
		default:
			last = ""
		}
	})
	return nil
}

func (s *ServingFiles) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}
