//go:build pkcs11

package pkcs11

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/meshca/meshca/internal/softhsm"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/upstreamtest"
	"github.com/miekg/pkcs11"
)

// TestContract runs the contract every upstream passes against the real
// SoftHSM2 module.
func TestContract(t *testing.T) {
	u := newUpstream(t, newToken(t))
	upstreamtest.Run(t, upstreamtest.Target{
		Upstream: u,
		Root: func(t testing.TB, kt certs.KeyType) (*x509.Certificate, upstream.Ref, crypto.Signer) {
			t.Helper()
			r, err := u.NewRoot(t.Context(), &upstream.RootRequest{KeyType: kt, Subject: pkix.Name{CommonName: "pkcs11 contract root " + string(kt)}, TTL: 24 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			return r.Cert, r.Ref, r.Key
		},
		Unknown: upstream.Ref{Type: Name, Key: keyRef{Label: "absent", ID: []byte{0xde, 0xad}}.String()},
	})
}

// TestKeyStaysInToken reads the root key's attributes back with
// pkcs11-tool, not with meshca's library: generated in the token,
// sensitive, never extractable, only for signing, invisible before login;
// and the Ref names it without any of its material.
func TestKeyStaysInToken(t *testing.T) {
	cfg := newToken(t)
	u := newUpstream(t, cfg)
	root := newRoot(t, u, certs.KeyECP256)
	k, err := parseKeyRef(root.Ref.Key)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := hsm.Objects(cfg.TokenLabel, cfg.PIN)
	if err != nil {
		t.Fatal(err)
	}
	var priv, pub int
	for _, o := range objs {
		if o.Label != k.Label {
			t.Errorf("unexpected object %+v", o)
			continue
		}
		switch o.Class {
		case "Private Key":
			priv++
			for _, want := range []string{"sensitive", "always sensitive", "never extractable", "local"} {
				if !slices.Contains(o.Access, want) {
					t.Errorf("private key's access %q lacks %q", o.Access, want)
				}
			}
			if slices.Contains(o.Access, "extractable") {
				t.Errorf("private key is extractable: %q", o.Access)
			}
			if !slices.Equal(o.Usage, []string{"sign"}) {
				t.Errorf("private key's usage %q, want only sign", o.Usage)
			}
		case "Public Key":
			pub++
		}
	}
	if priv != 1 || pub != 1 {
		t.Fatalf("token holds %d private and %d public keys labelled %s, want one each: %+v", priv, pub, k.Label, objs)
	}
	anon, err := hsm.Objects(cfg.TokenLabel, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range anon {
		if o.Class == "Private Key" {
			t.Errorf("the private key is visible without login: %+v", o)
		}
	}
	if strings.Contains(root.Ref.Key, cfg.PIN) || len(root.Ref.Key) > 100 {
		t.Errorf("Ref.Key %q holds more than the key's label and ID", root.Ref.Key)
	}
}

// selfSigned is a root certificate over key, built here rather than by
// the upstream, which refuses to make one over a key that can leave the
// token.
func selfSigned(key crypto.Signer) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leaky"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func wantError(t *testing.T, err error, kind upstream.Kind, msg string) {
	t.Helper()
	var ue *upstream.Error
	switch {
	case !errors.As(err, &ue):
		t.Fatalf("error %v (%T), want an *upstream.Error", err, err)
	case ue.Upstream != Name || ue.Kind != kind || !strings.Contains(err.Error(), msg):
		t.Fatalf("error %q of %s, kind %s; want kind %s and %q", err, ue.Upstream, ue.Kind, kind, msg)
	case strings.Contains(err.Error(), testPIN):
		t.Fatalf("error %q holds the PIN", err)
	}
}

func TestRefusals(t *testing.T) {
	cfg := newToken(t)
	u := newUpstream(t, cfg)
	root := newRoot(t, u, certs.KeyECP256)
	other := newRoot(t, u, certs.KeyECP256)
	// A root over a key that can leave the token: its certificate is
	// right, its custody is not.
	extractable := keyRef{Label: "extractable", ID: []byte{1, 2, 3}}
	var leaky *x509.Certificate
	if err := u.tok.do(context.Background(), func(c *crypto11.Context) error {
		pub, _ := crypto11.NewAttributeSetWithIDAndLabel(extractable.ID, []byte(extractable.Label))
		priv := pub.Copy()
		priv.AddIfNotPresent([]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true)})
		key, err := c.GenerateECDSAKeyPairWithAttributes(pub, priv, elliptic.P256())
		if err != nil {
			return err
		}
		leaky, err = selfSigned(key)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	tests := []struct {
		name string
		ctx  context.Context
		edit func(*upstream.Request)
		kind upstream.Kind
		msg  string
	}{
		{"another upstream's ref", nil, func(r *upstream.Request) { r.Ref = upstream.Ref{Type: "self"} }, upstream.KindRefused, `is kept by upstream "self", not in a PKCS#11 token`},
		{"malformed ref", nil, func(r *upstream.Request) { r.Ref.Key = "meshca-root" }, upstream.KindRefused, "is not a pkcs11: URI"},
		{"unknown key", nil, func(r *upstream.Request) { r.Ref.Key = keyRef{Label: "gone", ID: []byte{9}}.String() }, upstream.KindRefused, "no private key with this label and ID"},
		{"another root's key", nil, func(r *upstream.Request) { r.Ref = other.Ref }, upstream.KindRefused, "is not the root's key"},
		{"extractable key", nil, func(r *upstream.Request) { r.Root, r.Ref.Key, r.TTL = leaky, extractable.String(), time.Minute }, upstream.KindRefused, "can leave the token (CKA_SENSITIVE true, CKA_EXTRACTABLE true)"},
		{"deadline passed", expired, nil, upstream.KindUnavailable, "context deadline exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t, root)
			if tc.edit != nil {
				tc.edit(req)
			}
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			_, err := u.SignIntermediate(ctx, req)
			wantError(t, err, tc.kind, tc.msg)
		})
	}
}

func TestOpenRefusals(t *testing.T) {
	good := newToken(t)
	maker := newUpstream(t, good)
	root := newRoot(t, maker, certs.KeyECP256)
	// The login is the whole application's: log out first, or a wrong
	// PIN would ride on maker's login.
	maker.Close()
	tests := []struct {
		name string
		edit func(*Config)
		kind upstream.Kind
		msg  string
	}{
		{"wrong PIN", func(c *Config) { c.PIN = "not-the-pin" }, upstream.KindRefused,
			"CKR_PIN_INCORRECT (the token refused the PIN; meshca will not try it again until it restarts with another)"},
		{"no such module", func(c *Config) { c.Module = "/nonexistent/libpkcs11.so" }, upstream.KindRefused,
			"failed to open module (the module, or a library it needs (ldd lists them), is missing or not for this machine)"},
		{"no such token", func(c *Config) { c.TokenLabel = "absent" }, upstream.KindUnavailable,
			`could not find PKCS#11 token (no slot of the module holds it (pkcs11-tool --module <module> --list-slots))`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.edit(&cfg)
			_, err := newUpstream(t, cfg).SignIntermediate(context.Background(), request(t, root))
			wantError(t, err, tc.kind, tc.msg)
		})
	}
}

// TestWrongPINTriedOnce: a token locks its user PIN after a few wrong
// ones, so the upstream never retries a PIN the token refused, however
// often the renewer asks.
func TestWrongPINTriedOnce(t *testing.T) {
	cfg := newToken(t)
	maker := newUpstream(t, cfg)
	root := newRoot(t, maker, certs.KeyECP256)
	maker.Close()
	cfg.PIN = "not-the-pin"
	u := newUpstream(t, cfg)
	var logins int
	u.tok.open = func(c *crypto11.Config) (*crypto11.Context, error) {
		logins++
		return crypto11.Configure(c)
	}
	for range 3 {
		_, err := u.SignIntermediate(context.Background(), request(t, root))
		wantError(t, err, upstream.KindRefused, "CKR_PIN_INCORRECT")
	}
	if logins != 1 {
		t.Fatalf("%d logins with a PIN the token refused, want 1", logins)
	}
}

// TestConcurrentRenewals signs intermediates from many goroutines at once
// through one upstream (run with -race): each takes its own session.
func TestConcurrentRenewals(t *testing.T) {
	u := newUpstream(t, newToken(t))
	root := newRoot(t, u, certs.KeyECP256)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		req := request(t, root)
		wg.Go(func() {
			_, err := u.SignIntermediate(context.Background(), req)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestRelogin logs the application out of the token behind the
// upstream's back, as a token reset or an HSM failover does: the next
// renewal logs in again and succeeds.
func TestRelogin(t *testing.T) {
	cfg := newToken(t)
	u := newUpstream(t, cfg)
	var logins int
	u.tok.open = func(c *crypto11.Config) (*crypto11.Context, error) {
		logins++
		return crypto11.Configure(c)
	}
	root := newRoot(t, u, certs.KeyECP256)
	logout(t, cfg.TokenLabel)
	if _, err := u.SignIntermediate(context.Background(), request(t, root)); err != nil {
		t.Fatalf("after a logout: %v", err)
	}
	if logins != 2 {
		t.Fatalf("%d logins, want 2 (the first, and one after the logout)", logins)
	}
}

// logout calls C_Logout on the token through a handle of its own on the
// module: the login is the application's, shared by all its sessions.
func logout(t *testing.T, label string) {
	t.Helper()
	p := pkcs11.New(softhsm.Module)
	if p == nil {
		t.Fatal("cannot load the module")
	}
	defer p.Destroy() // not Finalize: the upstream's handle stays initialised
	if err := p.Initialize(); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		t.Fatal(err)
	}
	slots, err := p.GetSlotList(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		info, err := p.GetTokenInfo(s)
		if err != nil || info.Label != label {
			continue
		}
		sess, err := p.OpenSession(s, pkcs11.CKF_SERIAL_SESSION)
		if err != nil {
			t.Fatal(err)
		}
		defer p.CloseSession(sess)
		if err := p.Logout(sess); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no token %q", label)
}

func TestClosed(t *testing.T) {
	u := newUpstream(t, newToken(t))
	root := newRoot(t, u, certs.KeyECP256)
	u.Close()
	_, err := u.SignIntermediate(context.Background(), request(t, root))
	wantError(t, err, upstream.KindInternal, "the upstream is closed")
}
