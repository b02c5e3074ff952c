//go:build pkcs11

package pkcs11

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/meshca/meshca/keymgr/upstream"
)

// Supported reports whether this meshca was built with PKCS#11 support
// (the build tag pkcs11).
const Supported = true

// Upstream signs intermediates with a root key in a PKCS#11 token. It is
// safe for concurrent use; Close ends its session with the token.
type Upstream struct {
	cfg Config
	tok *token
}

var (
	_ upstream.Upstream  = (*Upstream)(nil)
	_ upstream.RootMaker = (*Upstream)(nil)
)

// New returns the upstream cfg describes. It does no I/O: the module is
// loaded and the token logged in on first use.
func New(cfg Config) (*Upstream, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.KeyLabel == "" {
		cfg.KeyLabel = DefaultKeyLabel
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Upstream{cfg: cfg, tok: &token{cfg: cfg, open: crypto11.Configure}}, nil
}

// SignIntermediate signs req.CSR's key as an intermediate under req.Root
// with the root's key in the token, which req.Ref names and whose public
// half must be req.Root's.
func (u *Upstream) SignIntermediate(ctx context.Context, req *upstream.Request) (*upstream.Response, error) {
	if req.Ref.Type != Name {
		return nil, u.refuse(fmt.Errorf("the root's key is in the %q upstream, not in a PKCS#11 token", req.Ref.Type))
	}
	k, err := parseKeyRef(req.Ref.Key)
	if err != nil {
		return nil, u.refuse(err)
	}
	var cert *x509.Certificate
	err = u.tok.do(ctx, func(c *crypto11.Context) error {
		key, err := find(c, k, req.Root.PublicKey)
		if err != nil {
			return err
		}
		cert, err = buildIntermediate(req, key, u.cfg.Now())
		return err
	})
	if err != nil {
		return nil, u.classify("sign an intermediate with "+k.String(), err)
	}
	return &upstream.Response{Cert: cert}, nil
}

// NewRoot generates a new root key in the token, labelled
// "<KeyLabel>-<UTC time>" with a random 16-byte ID, and self-signs the
// root with it. A key whose root could not be made is deleted again.
func (u *Upstream) NewRoot(ctx context.Context, req *upstream.RootRequest) (*upstream.Root, error) {
	r := *req
	if r.Now.IsZero() {
		r.Now = u.cfg.Now()
	}
	if r.TTL <= 0 {
		return nil, u.refuse(fmt.Errorf("a root's lifetime must be positive, not %v", r.TTL))
	}
	var root *upstream.Root
	label := u.cfg.KeyLabel + "-" + r.Now.UTC().Format("20060102T150405Z")
	err := u.tok.do(ctx, func(c *crypto11.Context) error {
		// A new ID at each attempt: a key made before a lost login is
		// never confused with this one.
		k := keyRef{Label: label, ID: make([]byte, 16)}
		if _, err := rand.Read(k.ID); err != nil {
			return err
		}
		key, err := generate(c, r.KeyType, k)
		if err != nil {
			return err
		}
		cert, err := buildRoot(&r, key)
		if err == nil && ctx.Err() != nil {
			err = ctx.Err() // nobody will record this key: do not leave it
		}
		if err != nil {
			return errors.Join(err, key.Delete())
		}
		root = &upstream.Root{Cert: cert, Ref: upstream.Ref{Type: Name, Key: k.String()}}
		return nil
	})
	if err != nil {
		return nil, u.classify("make a root key "+label, err)
	}
	return root, nil
}

// Close logs out of the token and closes its sessions.
func (u *Upstream) Close() error { return u.tok.close() }

// refuse is a request the upstream cannot serve whatever the token says.
func (u *Upstream) refuse(err error) error {
	return &upstream.Error{Upstream: Name, Kind: upstream.KindRefused, Err: err}
}
