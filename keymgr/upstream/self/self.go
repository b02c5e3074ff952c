// Package self is the upstream whose root key is meshca's own, in its CA
// state beside the root: the root key signs once a renewal of the
// intermediate instead of once a certificate, and `meshca root prepare
// --upstream self` makes a new one there.
package self

import (
	"context"
	"crypto"
	"fmt"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// Name is the upstream's name, --upstream's value and its Ref.Type.
const Name = "self"

// New returns the self upstream.
func New() *upstream.KeySigned {
	return &upstream.KeySigned{Name: Name, Key: key, NewKey: newKey, KeepKey: true}
}

// key is the root key the CA state holds, which the request carries.
func key(_ context.Context, req *upstream.Request) (crypto.Signer, error) {
	switch {
	case req.Ref.Type != Name:
		return nil, &upstream.Error{Upstream: Name, Kind: upstream.KindRefused,
			Err: fmt.Errorf("root %q is kept by upstream %q, not in the CA state", req.Root.Subject, req.Ref.Type)}
	case req.RootKey == nil:
		return nil, &upstream.Error{Upstream: Name, Kind: upstream.KindRefused,
			Err: fmt.Errorf("the CA state holds no key of root %q", req.Root.Subject)}
	}
	return req.RootKey, nil
}

// newKey generates a root key in memory; the CA state keeps it.
func newKey(_ context.Context, kt certs.KeyType, _ string) (crypto.Signer, upstream.Ref, error) {
	k, err := certs.GenerateKey(kt)
	if err != nil {
		return nil, upstream.Ref{}, err
	}
	return k, upstream.Ref{Type: Name}, nil
}
