package bundleendpoint

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultReloadInterval is how often a KeyPair looks at its files.
const DefaultReloadInterval = 30 * time.Second

// KeyPair is the operator's certificate for the https_web profile: a PEM
// chain and its key in two files, read again when they change (a renewed
// certificate, a Secret volume updated in place) without a restart.
type KeyPair struct {
	// Interval between looks at the files; DefaultReloadInterval when
	// zero. Set before Run.
	Interval time.Duration
	// OnReload and OnError, when set before Run, hear of every new
	// certificate put in service and of every change that could not be
	// used (the last good certificate keeps serving).
	OnReload func(*tls.Certificate)
	OnError  func(error)

	certFile, keyFile string
	current           atomic.Pointer[tls.Certificate]
	mu                sync.Mutex // one reload at a time
	certPEM, keyPEM   []byte
}

// LoadKeyPair reads the chain in certFile and its key in keyFile, which
// must match and hold a certificate valid now.
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// GetCertificate is a tls.Config.GetCertificate.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.current.Load(), nil
}

// Reload reads the files again and, when they changed and hold a usable
// certificate, serves it from now on. It reports whether it did; on an
// error the certificate served so far stays.
func (k *KeyPair) Reload() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	certPEM, err := os.ReadFile(k.certFile)
	if err != nil {
		return false, fmt.Errorf("bundleendpoint: certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(k.keyFile)
	if err != nil {
		return false, fmt.Errorf("bundleendpoint: key: %w", err)
	}
	if bytes.Equal(certPEM, k.certPEM) && bytes.Equal(keyPEM, k.keyPEM) {
		return false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("bundleendpoint: %s and %s: %w", k.certFile, k.keyFile, err)
	}
	now := time.Now()
	switch leaf := cert.Leaf; {
	case leaf == nil:
		return false, fmt.Errorf("bundleendpoint: %s holds no certificate", k.certFile)
	case now.After(leaf.NotAfter):
		return false, fmt.Errorf("bundleendpoint: %s expired at %s", k.certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return false, fmt.Errorf("bundleendpoint: %s is not valid before %s", k.certFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	case leaf.IsCA:
		return false, errors.New("bundleendpoint: " + k.certFile + " starts with a CA certificate, not the server's own")
	}
	k.certPEM, k.keyPEM = certPEM, keyPEM
	k.current.Store(&cert)
	return true, nil
}

// Run reloads the files every Interval until ctx ends, then returns nil.
func (k *KeyPair) Run(ctx context.Context) error {
	interval := k.Interval
	if interval <= 0 {
		interval = DefaultReloadInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		switch changed, err := k.Reload(); {
		case err != nil && k.OnError != nil:
			k.OnError(err)
		case changed && k.OnReload != nil:
			k.OnReload(k.current.Load())
		}
	}
}
