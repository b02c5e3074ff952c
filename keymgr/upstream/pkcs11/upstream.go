//go:build pkcs11

package pkcs11

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"io"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// Supported reports whether this meshca was built with PKCS#11 support
// (the build tag pkcs11).
const Supported = true

// Upstream signs intermediates with a root key in a PKCS#11 token: the
// certificates are upstream.KeySigned's, the token signs them. It is safe
// for concurrent use; Close ends its session with the token.
type Upstream struct {
	ks  upstream.KeySigned
	cfg Config
	tok *token
}

var (
	_ upstream.Upstream  = (*Upstream)(nil)
	_ upstream.RootMaker = (*Upstream)(nil)
	_ upstream.CRLSigner = (*Upstream)(nil)
)

// New returns the upstream cfg describes. It does no I/O: the module is
// loaded and the token logged in on first use.
func New(cfg Config) (*Upstream, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	u := &Upstream{cfg: cfg, tok: &token{cfg: cfg, open: crypto11.Configure}}
	u.ks = upstream.KeySigned{Name: Name, Key: u.key, NewKey: u.newKey, Destroy: u.destroyOrphan, Now: cfg.Now}
	return u, nil
}

// SignIntermediate signs req.CSR's key as an intermediate under req.Root
// with the root's key in the token, which req.Ref names and whose public
// half must be req.Root's.
func (u *Upstream) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	return u.ks.SignIntermediate(ctx, req)
}

// NewRoot generates a new root key in the token, labelled with the root's
// common name and a random 16-byte ID, and self-signs the root with it.
func (u *Upstream) NewRoot(ctx context.Context, req *upstream.RootRequest) (*upstream.Root, error) {
	return u.ks.NewRoot(ctx, req)
}

// SignCRL signs tmpl as issuer's CRL with its key in the token, which
// ref names.
func (u *Upstream) SignCRL(ctx context.Context, tmpl *x509.RevocationList, issuer *x509.Certificate, ref upstream.Ref) ([]byte, error) {
	return u.ks.SignCRL(ctx, tmpl, issuer, ref)
}

// Login loads the module and logs in to the token now, rather than at
// the first renewal, so that a wrong module, token or PIN shows at start.
func (u *Upstream) Login(ctx context.Context) error {
	_, _, err := u.tok.conn(ctx)
	return u.classify("log in", err)
}

// Close logs out of the token and closes its sessions.
func (u *Upstream) Close() error { return u.tok.close() }

// key finds the root key req.Ref names, checked to be req.Root's.
func (u *Upstream) key(ctx context.Context, req *upstream.Request) (crypto.Signer, error) {
	if req.Ref.Type != Name {
		return nil, u.refuse(fmt.Errorf("root %q is kept by upstream %q, not in a PKCS#11 token", req.Root.Subject, req.Ref.Type))
	}
	k, err := parseKeyRef(req.Ref.Key)
	if err != nil {
		return nil, u.refuse(err)
	}
	var pub crypto.PublicKey
	err = u.tok.do(ctx, func(c *crypto11.Context) error {
		key, err := find(c, k, req.Root.PublicKey)
		if err == nil {
			pub = key.Public()
		}
		return err
	})
	if err != nil {
		return nil, u.classify("find the root key "+k.String(), err)
	}
	return &tokenKey{u: u, ctx: ctx, ref: k, pub: pub}, nil
}

// newKey generates a key pair of type kt in the token, labelled label
// (DefaultKeyLabel and the time when empty) with a random 16-byte ID.
func (u *Upstream) newKey(ctx context.Context, kt certs.KeyType, label string) (crypto.Signer, upstream.Ref, error) {
	if label == "" {
		label = DefaultKeyLabel + " " + u.cfg.Now().UTC().Format(time.RFC3339)
	}
	var k keyRef
	var pub crypto.PublicKey
	err := u.tok.do(ctx, func(c *crypto11.Context) error {
		// A new ID at each attempt: a key made before a lost login is
		// never taken for this one.
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return err
		}
		key, err := generate(c, kt, keyRef{Label: label, ID: id})
		if err != nil {
			return err
		}
		k, pub = keyRef{Label: label, ID: id}, key.Public()
		return nil
	})
	if err != nil {
		return nil, upstream.Ref{}, u.classify("make a root key labelled "+label, err)
	}
	return &tokenKey{u: u, ctx: ctx, ref: k, pub: pub}, upstream.Ref{Type: Name, Key: k.String()}, nil
}

// A tokenKey is a root key in the token as a crypto.Signer, bound to the
// context of the renewal or root step that uses it. Each signature finds
// the key anew through the shared connection, so that one made after the
// token dropped the login logs in again rather than fail on a stale
// handle.
type tokenKey struct {
	u   *Upstream
	ctx context.Context
	ref keyRef
	pub crypto.PublicKey
}

func (k *tokenKey) Public() crypto.PublicKey { return k.pub }

// Sign has the token sign digest; rand is unused (the token draws its own).
func (k *tokenKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	var sig []byte
	err := k.u.tok.do(k.ctx, func(c *crypto11.Context) error {
		key, err := find(c, k.ref, k.pub)
		if err != nil {
			return err
		}
		s, err := key.Sign(rand.Reader, digest, opts)
		if err == nil {
			sig = s
		}
		return err
	})
	if err != nil {
		return nil, k.u.classify("sign with "+k.ref.String(), err)
	}
	return sig, nil
}

// refuse is a request the upstream cannot serve whatever the token says.
func (u *Upstream) refuse(err error) error {
	return &upstream.Error{Upstream: Name, Kind: upstream.KindRefused, Err: err}
}
