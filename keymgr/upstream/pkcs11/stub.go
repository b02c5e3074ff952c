//go:build !pkcs11

package pkcs11

import (
	"context"
	"crypto/x509"
	"errors"

	"github.com/meshca/meshca/keymgr/upstream"
)

// Supported reports whether this meshca was built with PKCS#11 support
// (the build tag pkcs11).
const Supported = false

var errNotBuilt = &upstream.Error{Upstream: Name, Kind: upstream.KindRefused, Err: errors.New(NotBuilt)}

// Upstream is the PKCS#11 upstream; this build has none.
type Upstream struct{}

// New says that this meshca was built without PKCS#11 support.
func New(Config) (*Upstream, error) { return nil, errNotBuilt }

// SignIntermediate fails: this build has no PKCS#11 support.
func (*Upstream) SignIntermediate(context.Context, *upstream.Request) (*upstream.Response, error) {
	return nil, errNotBuilt
}

// NewRoot fails: this build has no PKCS#11 support.
func (*Upstream) NewRoot(context.Context, *upstream.RootRequest) (*upstream.Root, error) {
	return nil, errNotBuilt
}

// SignCRL fails: this build has no PKCS#11 support.
func (*Upstream) SignCRL(context.Context, *x509.RevocationList, *x509.Certificate, upstream.Ref) ([]byte, error) {
	return nil, errNotBuilt
}

// Login fails: this build has no PKCS#11 support.
func (*Upstream) Login(context.Context) error { return errNotBuilt }

// Close does nothing.
func (*Upstream) Close() error { return nil }

// CheckDestroy fails: this build has no PKCS#11 support.
func (*Upstream) CheckDestroy(context.Context, *x509.Certificate, upstream.Ref) error {
	return errNotBuilt
}

// DestroyRoot fails: this build has no PKCS#11 support.
func (*Upstream) DestroyRoot(context.Context, *x509.Certificate, upstream.Ref) error {
	return errNotBuilt
}
