package vault

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// fuzzLogin is a login method that is never called: the fuzz target
// reads answers, it does not talk to Vault.
type fuzzLogin struct{}

func (fuzzLogin) Login(context.Context, *api.Client) (*api.Secret, error) {
	return nil, errors.New("no login in a fuzz target")
}

// vaultSignAnswer is the JSON body of a <mount>/sign/<role> answer.
func vaultSignAnswer(tb testing.TB, data map[string]any) []byte {
	tb.Helper()
	b, err := json.Marshal(map[string]any{
		"request_id": "5f0c1a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b", "lease_id": "", "renewable": false, "lease_duration": 0,
		"data": data, "wrap_info": nil, "warnings": nil, "auth": nil,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzSignResponse feeds the Vault signer any body for its
// <mount>/sign/<role> call: decoded as the Vault client decodes it
// (api.ParseSecret), then read by Signer.response, which picks the
// certificate and the CA chain out of it and checks them; and by
// certificateOf, which reads the issuers `meshca root --signer vault`
// creates. Nothing may panic. response fails only with a vault
// *signer.Error; a certificate it returns passes signer.CheckIssued for
// the request sent at now; and when the certificate field holds the leaf alone, no
// root travels among the intermediates.
func FuzzSignResponse(f *testing.F) {
	now := time.Now()
	opts := testca.Options{NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour)}
	root := testca.NewRoot(f, "vault root", opts)
	inter := root.NewIntermediate(f, "vault intermediate", opts)
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
	req := signertest.FixedKeyRequest(f, id, 24*time.Hour)
	leafPEM := string(pemutil.EncodeCertificates(signertest.WorkloadLeaf(f, inter, req, now.Add(-time.Minute), now.Add(req.TTL))))
	interPEM, rootPEM := string(pemutil.EncodeCertificates(inter.Cert)), string(pemutil.EncodeCertificates(root.Cert))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": leafPEM, "issuing_ca": interPEM, "ca_chain": []string{interPEM, rootPEM},
		"expiration": now.Add(req.TTL).Unix(), "serial_number": "09"}))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": leafPEM, "issuing_ca": interPEM}))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": leafPEM + interPEM, "ca_chain": []any{interPEM, 7, nil}}))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": rootPEM, "issuing_ca": rootPEM}))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": leafPEM, "ca_chain": []string{"junk"}}))
	f.Add(vaultSignAnswer(f, map[string]any{"certificate": 5}))
	f.Add(vaultSignAnswer(f, nil))
	f.Add([]byte(`{"data":{"certificate":"` + "-----BEGIN CERTIFICATE-----\\n-----END CERTIFICATE-----\\n" + `"}}`))
	f.Add([]byte(`{"errors":["permission denied"]}`))
	f.Add([]byte{})

	s, err := New(Config{Address: "https://vault.vault.svc:8200", Role: "mesh", Auth: fuzzLogin{}, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		secret, err := api.ParseSecret(bytes.NewReader(body))
		if err != nil {
			return
		}
		resp, err := s.response(req, secret, "mesh", now, req.TTL)
		if err != nil {
			var se *signer.Error
			if !errors.As(err, &se) || se.Backend != name || (se.Kind != signer.KindRefused && se.Kind != signer.KindInternal) {
				t.Fatalf("response failed with %v (%T), not a vault *signer.Error", err, err)
			}
			return
		}
		if err := signer.CheckIssued(name, req, resp.Leaf, signer.Lifetime{Start: now}); err != nil {
			t.Fatalf("response returned a certificate that breaks the rules: %v", err)
		}
		certPEM, _ := secret.Data["certificate"].(string)
		if parsed, err := pemutil.ParseCertificates([]byte(certPEM)); err == nil && len(parsed) == 1 {
			for _, c := range resp.Intermediates {
				if certs.IsSelfSigned(c) {
					t.Fatalf("response returned the root %q among the intermediates", c.Subject)
				}
			}
		}
	})
}
