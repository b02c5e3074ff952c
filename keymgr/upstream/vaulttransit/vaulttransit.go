// Package vaulttransit is the vault-transit upstream: the root key is a
// Vault Transit key that never leaves Vault (exportable=false,
// allow_plaintext_backup=false), and meshca builds the root and
// intermediate certificates (upstream.KeySigned) and has Transit sign
// them (<mount>/sign/<name> with the digest, prehashed). The root's
// upstream.Ref names the key and its version ("<name>:<version>"), so a
// rotation of the Transit key never changes the key of a root.
//
// What it needs of Vault's policy: update on <mount>/sign/<name> and
// read on <mount>/keys/<name>; `meshca root prepare` also creates the key
// (docs/upstream.md).
package vaulttransit

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/vaultauth"
)

// Name is the upstream's name, in flags and in upstream.Ref.Type.
const Name = "vault-transit"

// Config of the vault-transit upstream.
type Config struct {
	// Login is how meshca logs in to Vault.
	Login vaultauth.Config
	// Mount of the Transit secrets engine; "transit" when empty.
	Mount string
	// Key names the Transit key NewRoot makes the root with: created when
	// it does not exist, taken (its latest version) when it does and is
	// neither exportable nor backed up in plaintext. Empty: a new key
	// named meshca-root-<time>.
	Key string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Upstream is the vault-transit upstream: upstream.KeySigned over a
// Transit key. Run keeps its login alive.
type Upstream struct {
	*upstream.KeySigned
	c    Config
	sess *vaultauth.Session
}

// New returns the upstream; it does no I/O.
func New(c Config) (*Upstream, error) {
	if c.Mount == "" {
		c.Mount = "transit"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Key != "" && strings.ContainsAny(c.Key, "/?#:") {
		return nil, fmt.Errorf("vaulttransit: %q is not a Transit key name", c.Key)
	}
	sess, err := vaultauth.NewSession(c.Login)
	if err != nil {
		return nil, fmt.Errorf("vaulttransit: %w", err)
	}
	u := &Upstream{c: c, sess: sess}
	u.KeySigned = &upstream.KeySigned{Name: Name, Key: u.signer, NewKey: u.newKey, Destroy: u.destroyOrphan, Now: c.Now}
	return u, nil
}

// Run keeps the login alive until ctx ends.
func (u *Upstream) Run(ctx context.Context) error { return u.sess.Run(ctx) }

// signer is the signer of the key version req.Ref names.
func (u *Upstream) signer(ctx context.Context, req *upstream.Request) (crypto.Signer, error) {
	if req.Ref.Type != Name {
		return nil, errorf(upstream.KindRefused, "root %q is kept by %q, not in Vault Transit", req.Root.Subject, req.Ref.Type)
	}
	ref, err := parseKeyRef(req.Ref.Key)
	if err != nil {
		return nil, errorf(upstream.KindRefused, "root %q: %v", req.Root.Subject, err)
	}
	return u.keySigner(ctx, ref)
}

// keySigner reads the key ref names and returns the signer of its
// version, refusing a key that can leave Vault.
func (u *Upstream) keySigner(ctx context.Context, ref keyRef) (*keySigner, error) {
	k, err := u.readKey(ctx, ref.name)
	if err != nil {
		return nil, err
	}
	if k == nil {
		return nil, errorf(upstream.KindRefused, "%s/keys/%s does not exist", u.c.Mount, ref.name)
	}
	if err := k.custody(u.c.Mount, ref.name); err != nil {
		return nil, err
	}
	v, ok := k.Keys[strconv.Itoa(ref.version)]
	if !ok {
		return nil, errorf(upstream.KindRefused, "%s/keys/%s has no version %d (trimmed?)", u.c.Mount, ref.name, ref.version)
	}
	pub, err := parsePublicKey(v.PublicKey)
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s/keys/%s version %d: %v", u.c.Mount, ref.name, ref.version, err)
	}
	return &keySigner{ctx: ctx, u: u, key: ref, keyType: k.Type, pub: pub}, nil
}

// newKey makes the root key of a new lineage: Config.Key, or a key of
// its own, created non-exportable, or taken when Config.Key exists.
func (u *Upstream) newKey(ctx context.Context, kt certs.KeyType, _ string) (crypto.Signer, upstream.Ref, error) {
	typ, ok := keyTypes[kt]
	if !ok {
		return nil, upstream.Ref{}, errorf(upstream.KindRefused, "Transit has no key type for %q", kt)
	}
	name := u.c.Key
	if name == "" {
		name = "meshca-root-" + strings.ToLower(u.c.Now().UTC().Format("20060102T150405Z")+"-"+rand.Text()[:6])
	}
	k, err := u.readKey(ctx, name)
	if err != nil {
		return nil, upstream.Ref{}, err
	}
	if k == nil {
		path := u.c.Mount + "/keys/" + name
		if _, err := u.sess.Write(ctx, path, map[string]any{"type": typ, "exportable": false, "allow_plaintext_backup": false}); err != nil {
			return nil, upstream.Ref{}, upstreamError(err)
		}
		if k, err = u.readKey(ctx, name); err != nil {
			return nil, upstream.Ref{}, err
		}
		if k == nil {
			return nil, upstream.Ref{}, errorf(upstream.KindInternal, "%s: created, then not found", path)
		}
	}
	if k.Type != typ {
		return nil, upstream.Ref{}, errorf(upstream.KindRefused, "%s/keys/%s is a %s key, not %s (--key-type %s)", u.c.Mount, name, k.Type, typ, kt)
	}
	ref := keyRef{name: name, version: k.LatestVersion}
	s, err := u.keySigner(ctx, ref)
	if err != nil {
		return nil, upstream.Ref{}, err
	}
	return s, upstream.Ref{Type: Name, Key: ref.String()}, nil
}

// keyTypes are Transit's key types for meshca's.
var keyTypes = map[certs.KeyType]string{
	certs.KeyECP256:  "ecdsa-p256",
	certs.KeyECP384:  "ecdsa-p384",
	certs.KeyRSA2048: "rsa-2048",
	certs.KeyRSA3072: "rsa-3072",
	certs.KeyRSA4096: "rsa-4096",
}

// transitKey is what <mount>/keys/<name> says of a key.
type transitKey struct {
	Type                 string `json:"type"`
	Exportable           bool   `json:"exportable"`
	AllowPlaintextBackup bool   `json:"allow_plaintext_backup"`
	DeletionAllowed      bool   `json:"deletion_allowed"`
	LatestVersion        int    `json:"latest_version"`
	Keys                 map[string]struct {
		PublicKey string `json:"public_key"`
	} `json:"keys"`
}

// readKey reads the key name; nil when there is none.
func (u *Upstream) readKey(ctx context.Context, name string) (*transitKey, error) {
	path := u.c.Mount + "/keys/" + name
	secret, err := u.sess.Read(ctx, path)
	switch {
	case err != nil && vaultauth.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, upstreamError(err)
	case secret == nil || secret.Data == nil:
		return nil, nil
	}
	raw, err := json.Marshal(secret.Data)
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: %v", path, err)
	}
	var k transitKey
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, errorf(upstream.KindInternal, "%s: %v", path, err)
	}
	return &k, nil
}

// custody refuses a key that can leave Vault: Transit never makes an
// exportable key unexportable again, so such a key is no root key.
func (k *transitKey) custody(mount, name string) error {
	switch {
	case k.Exportable:
		return errorf(upstream.KindRefused, "%s/keys/%s is exportable: a root key must never leave Vault (make a new root: meshca root prepare --upstream %s)", mount, name, Name)
	case k.AllowPlaintextBackup:
		return errorf(upstream.KindRefused, "%s/keys/%s allows a plaintext backup: a root key must never leave Vault (make a new root: meshca root prepare --upstream %s)", mount, name, Name)
	case !strings.HasPrefix(k.Type, "ecdsa-p") && !strings.HasPrefix(k.Type, "rsa-"):
		return errorf(upstream.KindRefused, "%s/keys/%s is a %s key: meshca's roots are ECDSA or RSA", mount, name, k.Type)
	}
	return nil
}

func parsePublicKey(p string) (crypto.PublicKey, error) {
	block, _ := pem.Decode([]byte(p))
	if block == nil {
		return nil, fmt.Errorf("no PEM public key")
	}
	return x509.ParsePKIXPublicKey(block.Bytes)
}

// upstreamError is a Vault failure as an *upstream.Error of the kind
// vaultauth gives it.
func upstreamError(err error) error {
	kind := upstream.KindRefused
	if vaultauth.KindOf(err) == vaultauth.KindUnavailable {
		kind = upstream.KindUnavailable
	}
	return &upstream.Error{Upstream: Name, Kind: kind, Err: err}
}

func errorf(kind upstream.Kind, format string, args ...any) error {
	return &upstream.Error{Upstream: Name, Kind: kind, Err: fmt.Errorf(format, args...)}
}
