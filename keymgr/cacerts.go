package keymgr

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
)

// File names of Istio's plugged-in CA layout (the cacerts Secret).
const (
	FileCACert    = "ca-cert.pem"
	FileCAKey     = "ca-key.pem"
	FileCertChain = "cert-chain.pem"
	FileRootCert  = "root-cert.pem"
	// The kubernetes.io/tls layout, as cert-manager writes it.
	FileTLSCert = "tls.crt"
	FileTLSKey  = "tls.key"
	FileTLSCA   = "ca.crt"
)

// FileError says which input file is wrong and why.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return fmt.Sprintf("keymgr: %s: %v", e.Path, e.Err) }
func (e *FileError) Unwrap() error { return e.Err }

// LoadCACerts loads a signing CA from dir, in Istio's cacerts layout
// (ca-cert.pem, ca-key.pem, root-cert.pem and optionally cert-chain.pem,
// which runs from the signing cert upwards and may end in the root) or in
// the kubernetes.io/tls layout (tls.crt holding the signing cert and its
// chain, tls.key, ca.crt holding the roots). The result is validated at
// time now; errors are *FileError values naming the offending file.
func LoadCACerts(dir string, now time.Time) (*Authority, error) {
	var l layout
	switch {
	case exists(filepath.Join(dir, FileCACert)):
		l = layout{cert: FileCACert, key: FileCAKey, chain: FileCertChain, roots: FileRootCert}
	case exists(filepath.Join(dir, FileTLSCert)):
		l = layout{cert: FileTLSCert, key: FileTLSKey, chain: FileTLSCert, roots: FileTLSCA}
	default:
		return nil, &FileError{Path: dir, Err: fmt.Errorf("holds neither %s nor %s", FileCACert, FileTLSCert)}
	}
	return l.load(dir, now)
}

type layout struct {
	cert, key, chain, roots string
}

func (l layout) load(dir string, now time.Time) (*Authority, error) {
	path := func(name string) string { return filepath.Join(dir, name) }
	certs, err := readCerts(path(l.cert), true)
	if err != nil {
		return nil, err
	}
	a := &Authority{Cert: certs[0]}
	if err := checkSigningCert(a.Cert, now); err != nil {
		return nil, &FileError{Path: path(l.cert), Err: trimPrefix(err)}
	}
	if a.Key, err = readKey(path(l.key)); err != nil {
		return nil, err
	}
	if !csr.SamePublicKey(a.Key.Public(), a.Cert.PublicKey) {
		return nil, &FileError{Path: path(l.key), Err: fmt.Errorf("does not match the public key of the certificate in %s", l.cert)}
	}
	if a.Roots, err = readCerts(path(l.roots), true); err != nil {
		return nil, err
	}
	for i, r := range a.Roots {
		if err := checkRoot(r); err != nil {
			return nil, &FileError{Path: path(l.roots), Err: fmt.Errorf("certificate %d (%s): %w", i+1, r.Subject, err)}
		}
	}
	chainFile := l.chain
	chain := certs[1:]
	if l.chain != l.cert {
		if chain, err = readCerts(path(l.chain), false); err != nil {
			return nil, err
		}
	} else if len(certs) == 1 {
		chainFile = l.cert
	}
	if a.Chain, err = intermediates(a, chain); err != nil {
		return nil, &FileError{Path: path(chainFile), Err: err}
	}
	if err := a.verifyChain(now); err != nil {
		blame := chainFile
		if len(a.Chain) == 0 {
			blame = l.cert
		}
		return nil, &FileError{Path: path(blame), Err: fmt.Errorf("signing certificate does not chain to a root in %s: %w", l.roots, err)}
	}
	return a, nil
}

// intermediates strips the signing cert and the roots from a chain file's
// certificates. A self-signed certificate in the chain must be one of the
// trusted roots.
func intermediates(a *Authority, chain []*x509.Certificate) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for _, c := range chain {
		switch {
		case c.Equal(a.Cert):
			continue
		case checkRoot(c) == nil:
			if !containsCert(a.Roots, c) {
				return nil, fmt.Errorf("ends in root %q, which the roots file does not hold", c.Subject)
			}
			continue
		case !c.IsCA:
			return nil, fmt.Errorf("certificate %q is not a CA", c.Subject)
		}
		out = append(out, c)
	}
	return out, nil
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

func readCerts(path string, required bool) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, &FileError{Path: path, Err: errors.Unwrap(err)}
	}
	certs, err := pemutil.ParseCertificates(data)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	return certs, nil
}

func readKey(path string) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FileError{Path: path, Err: errors.Unwrap(err)}
	}
	key, err := pemutil.ParsePrivateKey(data)
	if err != nil {
		return nil, &FileError{Path: path, Err: err}
	}
	return key, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// trimPrefix drops the package prefix from an error that will be wrapped in
// a FileError, which adds its own.
func trimPrefix(err error) error {
	const p = "keymgr: "
	if s := err.Error(); len(s) > len(p) && s[:len(p)] == p {
		return errors.New(s[len(p):])
	}
	return err
}
