package upstreams

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/upstreamtest"
	"github.com/meshca/meshca/keymgr/upstream/vaultpki"
	"github.com/meshca/meshca/keymgr/upstream/vaulttransit"
	"github.com/meshca/meshca/vaultauth"
)

// rootToken writes the dev server's root token to a file for a
// vaultauth.TokenFile login.
func rootToken(t testing.TB) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "root.token")
	if err := os.WriteFile(file, []byte(harness.VaultRootToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// login is a token-file login to v, with short timeouts for the tests.
func login(v *harness.Vault, tokenFile string) vaultauth.Config {
	return vaultauth.Config{Address: v.Addr, Auth: vaultauth.TokenFile{Path: tokenFile}, Timeout: 5 * time.Second, ReloginBackoff: time.Second}
}

// running starts u's login loop until the test ends.
func running(t testing.TB, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func newPKI(t testing.TB, v *harness.Vault, mount, tokenFile string) *vaultpki.Upstream {
	t.Helper()
	u, err := vaultpki.New(vaultpki.Config{Login: login(v, tokenFile), Mount: mount})
	if err != nil {
		t.Fatal(err)
	}
	running(t, u.Run)
	return u
}

func newTransit(t testing.TB, v *harness.Vault, mount, tokenFile, key string) *vaulttransit.Upstream {
	t.Helper()
	u, err := vaulttransit.New(vaulttransit.Config{Login: login(v, tokenFile), Mount: mount, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	running(t, u.Run)
	return u
}

// newRoot makes a root of kt with rm, as `meshca root prepare` does.
func newRoot(t testing.TB, rm upstream.RootMaker, kt certs.KeyType) *upstream.Root {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := rm.NewRoot(ctx, &upstream.RootRequest{KeyType: kt, Subject: pkix.Name{CommonName: "upstreams test root " + string(kt)}, TTL: 24 * time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatalf("NewRoot: %v", err)
	}
	return r
}

func TestVaultPKIContract(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki-mesh")
	u := newPKI(t, v, "pki-mesh", rootToken(t))
	upstreamtest.Run(t, upstreamtest.Target{
		Upstream: u,
		Root: func(t testing.TB, kt certs.KeyType) (*x509.Certificate, upstream.Ref, crypto.Signer) {
			r := newRoot(t, u, kt)
			return r.Cert, r.Ref, nil
		},
		Unknown: upstream.Ref{Type: vaultpki.Name, Key: "2f3ab0a4-6a3c-4a7e-9a51-0c9d6b1f4d1e"},
	})
}

func TestVaultTransitContract(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	u := newTransit(t, v, "transit", rootToken(t), "")
	upstreamtest.Run(t, upstreamtest.Target{
		Upstream: u,
		KeyTypes: []certs.KeyType{certs.KeyECP256, certs.KeyECP384, certs.KeyRSA2048, certs.KeyRSA3072},
		Root: func(t testing.TB, kt certs.KeyType) (*x509.Certificate, upstream.Ref, crypto.Signer) {
			r := newRoot(t, u, kt)
			return r.Cert, r.Ref, nil
		},
		Unknown: upstream.Ref{Type: vaulttransit.Name, Key: "meshca-root-nobody:1"},
	})
}

// keyName is the Transit key name of ref ("<name>:<version>").
func keyName(t testing.TB, ref upstream.Ref) string {
	t.Helper()
	name, _, ok := strings.Cut(ref.Key, ":")
	if !ok {
		t.Fatalf("Ref.Key %q is not <name>:<version>", ref.Key)
	}
	return name
}

// sign asks u for an intermediate under r and holds it to Check.
func sign(t testing.TB, u upstream.Upstream, r *upstream.Root) error {
	t.Helper()
	req, _ := upstreamtest.Request(t, r.Cert, r.Ref, nil, certs.KeyECP256, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	at := time.Now()
	resp, err := u.SignIntermediate(ctx, req)
	if err != nil {
		return err
	}
	if err := upstream.Check(req, resp, at, []*x509.Certificate{r.Cert}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return nil
}

// wantKind fails t unless err is an *upstream.Error of kind whose
// message holds every word.
func wantKind(t testing.TB, what string, err error, kind upstream.Kind, words ...string) {
	t.Helper()
	if got := upstream.KindOf(err); err == nil || got != kind {
		t.Fatalf("%s: got %v (kind %s), want kind %s", what, err, got, kind)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not say %q", what, err, w)
		}
	}
}

// TestVaultTransitKeyStaysInVault: the root key meshca makes in Transit
// is neither exportable nor backed up in plaintext, and Vault refuses to
// export or back it up; meshca refuses to sign with, or make a root of,
// a Transit key that can leave Vault; a rotation of the Transit key does
// not change the key of the root (Ref names the version).
func TestVaultTransitKeyStaysInVault(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	ctx := context.Background()
	u := newTransit(t, v, "transit", rootToken(t), "")
	r := newRoot(t, u, certs.KeyECP256)
	name := keyName(t, r.Ref)
	if r.Key != nil {
		t.Fatal("NewRoot returned a private key for the CA state")
	}
	k, err := v.Client.Logical().ReadWithContext(ctx, "transit/keys/"+name)
	if err != nil {
		t.Fatal(err)
	}
	if k.Data["exportable"] != false || k.Data["allow_plaintext_backup"] != false || k.Data["type"] != "ecdsa-p256" {
		t.Fatalf("transit/keys/%s: exportable %v, allow_plaintext_backup %v, type %v; want false, false, ecdsa-p256",
			name, k.Data["exportable"], k.Data["allow_plaintext_backup"], k.Data["type"])
	}
	for _, path := range []string{"transit/export/signing-key/" + name, "transit/export/public-key/" + name + "/1", "transit/backup/" + name} {
		s, err := v.Client.Logical().ReadWithContext(ctx, path)
		if err == nil && path != "transit/export/public-key/"+name+"/1" {
			t.Fatalf("%s answered %v, want a refusal", path, s.Data)
		}
		if err == nil && strings.Contains(fmt.Sprint(s.Data), "PRIVATE") {
			t.Fatalf("%s gave a private key", path)
		}
		var re *api.ResponseError
		if errors.As(err, &re) {
			t.Logf("%s: %d %v", path, re.StatusCode, re.Errors)
		}
	}

	// A rotation of the Transit key: the root keeps signing with version 1.
	if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/"+name+"/rotate", nil); err != nil {
		t.Fatal(err)
	}
	if err := sign(t, u, r); err != nil {
		t.Fatalf("after a rotation of the Transit key: %v", err)
	}

	// A key an operator made exportable is no root key any more.
	if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/"+name+"/config", map[string]any{"exportable": true}); err != nil {
		t.Fatal(err)
	}
	wantKind(t, "signing with an exportable key", sign(t, u, r), upstream.KindRefused, "exportable", "root prepare")

	// Nor does meshca make a root of an existing key that can leave Vault.
	for _, key := range []struct{ name, flags, says string }{
		{"exportable-root", "exportable", "is exportable"}, {"backed-up-root", "allow_plaintext_backup", "plaintext backup"},
	} {
		if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/"+key.name, map[string]any{"type": "ecdsa-p256", key.flags: true}); err != nil {
			t.Fatal(err)
		}
		adopt := newTransit(t, v, "transit", rootToken(t), key.name)
		_, err := adopt.NewRoot(ctx, &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "x"}, TTL: time.Hour})
		wantKind(t, "a root of "+key.name, err, upstream.KindRefused, key.name, key.says)
	}
}

// TestVaultTransitAdoptsKey: a Transit key the operator made (not
// exportable) becomes a root's key, its latest version named in the Ref;
// one of another type is refused.
func TestVaultTransitAdoptsKey(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	ctx := context.Background()
	if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/org-root", map[string]any{"type": "ecdsa-p384"}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Client.Logical().WriteWithContext(ctx, "transit/keys/org-root/rotate", nil); err != nil {
		t.Fatal(err)
	}
	u := newTransit(t, v, "transit", rootToken(t), "org-root")
	r := newRoot(t, u, certs.KeyECP384)
	if r.Ref != (upstream.Ref{Type: vaulttransit.Name, Key: "org-root:2"}) {
		t.Fatalf("Ref %+v, want org-root:2", r.Ref)
	}
	if err := sign(t, u, r); err != nil {
		t.Fatal(err)
	}
	_, err := u.NewRoot(ctx, &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "x"}, TTL: time.Hour})
	wantKind(t, "a P-256 root of a P-384 key", err, upstream.KindRefused, "ecdsa-p384")
}

// docPolicy is the Vault policy docs/upstream.md gives under the marker
// <!-- policy: name -->, with each placeholder replaced.
func docPolicy(t testing.TB, name string, placeholders ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "upstream.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- policy: " + regexp.QuoteMeta(name) + " -->\\s*```hcl\n(.*?)```")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/upstream.md has no policy %s", name)
	}
	return strings.NewReplacer(placeholders...).Replace(string(m[1]))
}

// TestVaultTransitPolicies: with the policy docs/upstream.md gives
// meshca serve, the upstream signs intermediates and nothing more: it
// cannot make a root key, nor read another key; the admin policy of
// `meshca root prepare` makes one.
func TestVaultTransitPolicies(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountTransit(t, "transit")
	_, adminFile := v.PolicyToken(t, "meshca-transit-admin", docPolicy(t, "meshca-transit-admin"))
	_, serveFile := v.PolicyToken(t, "meshca-transit", docPolicy(t, "meshca-transit"))
	admin := newTransit(t, v, "transit", adminFile, "")
	r := newRoot(t, admin, certs.KeyECP256)
	// prepare signs the new lineage's first intermediate too.
	if err := sign(t, admin, r); err != nil {
		t.Fatalf("the admin policy: %v", err)
	}
	serve := newTransit(t, v, "transit", serveFile, "")
	if err := sign(t, serve, r); err != nil {
		t.Fatalf("serve's policy: %v", err)
	}
	_, err := serve.NewRoot(context.Background(), &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "x"}, TTL: time.Hour})
	wantKind(t, "serve's policy making a root", err, upstream.KindRefused, "permission denied")
	if _, err := v.Client.Logical().WriteWithContext(context.Background(), "transit/keys/someone-else", map[string]any{"type": "ecdsa-p256"}); err != nil {
		t.Fatal(err)
	}
	other := &upstream.Root{Cert: r.Cert, Ref: upstream.Ref{Type: vaulttransit.Name, Key: "someone-else:1"}}
	wantKind(t, "serve's policy signing with another key", sign(t, serve, other), upstream.KindRefused, "permission denied")
}

// TestVaultPKIPolicies: with the policy docs/upstream.md gives meshca
// serve (sign-intermediate on one issuer), the upstream signs and reads
// the mount's roots, and cannot sign with another issuer nor make one;
// the admin policy of `meshca root prepare` makes issuers and has them
// sign a lineage's first intermediate.
func TestVaultPKIPolicies(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki-mesh")
	ctx := context.Background()
	_, adminFile := v.PolicyToken(t, "meshca-pki-admin", docPolicy(t, "meshca-pki-admin", "pki/", "pki-mesh/"))
	admin := newPKI(t, v, "pki-mesh", adminFile)
	r := newRoot(t, admin, certs.KeyECP256)
	other := newRoot(t, admin, certs.KeyECP256)
	// prepare signs the new lineage's first intermediate too.
	if err := sign(t, admin, r); err != nil {
		t.Fatalf("the admin policy: %v", err)
	}
	_, serveFile := v.PolicyToken(t, "meshca-pki", docPolicy(t, "meshca-pki", "pki/", "pki-mesh/", "ISSUER_ID", r.Ref.Key))
	serve := newPKI(t, v, "pki-mesh", serveFile)
	if err := sign(t, serve, r); err != nil {
		t.Fatalf("serve's policy: %v", err)
	}
	roots, err := serve.Roots(ctx)
	if err != nil || len(roots) != 2 {
		t.Fatalf("Roots with serve's policy: %d roots, %v; want 2", len(roots), err)
	}
	wantKind(t, "serve's policy signing with another issuer", sign(t, serve, other), upstream.KindRefused, "permission denied")
	_, err = serve.NewRoot(ctx, &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "x"}, TTL: time.Hour})
	wantKind(t, "serve's policy making a root", err, upstream.KindRefused, "permission denied")
}

// TestVaultPKIAdoptsIssuer: an issuer the organisation made (here an
// intermediate in the mount under a root imported beside it) becomes the
// root of a lineage: the Ref names the intermediate issuer, Root is the
// self-signed end of its chain, and answers carry the issuer in Chain.
func TestVaultPKIAdoptsIssuer(t *testing.T) {
	v := harness.StartVault(t, vaultBin)
	v.MountPKI(t, "pki-mesh")
	v.MountPKI(t, "pki-offline")
	ctx := context.Background()
	client, err := vaultauth.Login(ctx, login(v, rootToken(t)))
	if err != nil {
		t.Fatal(err)
	}
	is := vaultpki.NewIssuers(client, "pki-mesh")
	spec := func(name string) vaultpki.IssuerSpec {
		return vaultpki.IssuerSpec{CommonName: name, KeyType: certs.KeyECP256, TTL: 48 * time.Hour, Name: name + "-" + strings.ToLower(rand.Text()[:4])}
	}
	root, inter, err := is.CreateIntermediate(ctx, "pki-offline", spec("org-root"), spec("org-intermediate"))
	if err != nil {
		t.Fatal(err)
	}
	// meshca publishes the root: import it into the mount too.
	if _, err := client.Logical().WriteWithContext(ctx, "pki-mesh/issuers/import/cert", map[string]any{"pem_bundle": string(pemOf(root))}); err != nil {
		t.Fatal(err)
	}
	all, err := is.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var interID string
	for _, i := range all {
		if i.Cert.Equal(inter) {
			interID = i.Name
		}
	}
	u, err := vaultpki.New(vaultpki.Config{Login: login(v, rootToken(t)), Mount: "pki-mesh", Issuer: interID})
	if err != nil {
		t.Fatal(err)
	}
	running(t, u.Run)
	r := newRoot(t, u, certs.KeyECP256)
	if !r.Cert.Equal(root) {
		t.Fatalf("the adopted lineage's root is %q, want %q", r.Cert.Subject, root.Subject)
	}
	req, _ := upstreamtest.Request(t, r.Cert, r.Ref, nil, certs.KeyECP256, time.Hour)
	at := time.Now()
	resp, err := u.SignIntermediate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Chain) != 1 || !resp.Chain[0].Equal(inter) {
		t.Fatalf("Chain has %d certificates, want the issuer %q", len(resp.Chain), inter.Subject)
	}
	if err := upstream.Check(req, resp, at, []*x509.Certificate{root}); err != nil {
		t.Fatal(err)
	}
}

func pemOf(c *x509.Certificate) []byte { return pemutil.EncodeCertificates(c) }
