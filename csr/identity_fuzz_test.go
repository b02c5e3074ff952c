package csr_test

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// FuzzCSRIdentity: a request whose one SAN is any URI, signed by any
// workload key type, goes through Parse and Policy.Check against the
// identity the URI names (when it is a SPIFFE ID) and against a fixed
// one. Neither may panic and every refusal is a typed error. The request
// is accepted for the identity it names exactly when that URI is a SPIFFE
// ID, and then the parsed request's URI is that ID and parses back to it:
// the ID round-trips through the CSR. It is accepted for the fixed identity
// only when its URI is, byte for byte, that identity: no case, escaping,
// trailing slash or dot-segment variant of it passes.
func FuzzCSRIdentity(f *testing.F) {
	for _, s := range []string{
		testID.String(), otherID.String(),
		"spiffe://cluster.local/ns/default/sa/httpbin/",
		"SPIFFE://cluster.local/ns/default/sa/httpbin",
		"spiffe://Cluster.Local/ns/default/sa/httpbin",
		"spiffe://cluster.local/ns/default/sa/%68ttpbin",
		"spiffe://cluster.local/ns/default/sa/./httpbin",
		"spiffe://cluster.local/ns/default/sa/httpbin?x=1",
		"spiffe://cluster.local/ns/default/sa/httpbin#f",
		"spiffe://user@cluster.local/ns/default/sa/httpbin",
		"spiffe://cluster.local:443/ns/default/sa/httpbin",
		"spiffe://cluster.local/ns/default/sa/httpbin\x00",
		"https://cluster.local/ns/default/sa/httpbin",
		"",
	} {
		f.Add(s, uint8(0))
	}
	f.Add(testID.String(), uint8(1))
	f.Add(testID.String(), uint8(2))
	f.Add(testID.String(), uint8(3))
	keys := []func() crypto.Signer{p256Key, ed25519Key, p384Key, rsa2048Key}
	policy := csr.DefaultPolicy()
	f.Fuzz(func(t *testing.T, uri string, keyKind uint8) {
		key := keys[int(keyKind)%len(keys)]()
		san, err := csr.MarshalURISAN(uri)
		if err != nil {
			return
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{san}}, key)
		if err != nil {
			return
		}
		req, err := csr.Parse(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
		if err != nil {
			requireTyped(t, err)
			return
		}
		if err := policy.Check(req, testID); err != nil {
			requireTyped(t, err)
		} else if uri != testID.String() {
			t.Fatalf("a request for %q was accepted for %s", uri, testID)
		}
		id, err := spiffeid.FromString(uri)
		if err != nil {
			return
		}
		if err := policy.Check(req, id); err != nil {
			t.Fatalf("a request for exactly %s was refused: %v", id, err)
		}
		if len(req.URIs) != 1 || req.URIs[0].String() != id.String() {
			t.Fatalf("request for %s parsed with URIs %v", id, req.URIs)
		}
		if got, err := spiffeid.FromURI(req.URIs[0]); err != nil || got != id {
			t.Fatalf("the request's URI reads as %v (%v), want %v", got, err, id)
		}
	})
}

// FuzzParseUsages: usage names as a cfssl signing profile lists them
// (--cfssl-config) are parsed without panicking; an unknown name is a
// typed error; and a parsed set is sorted without duplicates and reads
// back the same from its canonical names, so that the usages meshca
// hands a profile are the ones it parsed.
func FuzzParseUsages(f *testing.F) {
	f.Add("signing,digital signature,key encipherment,server auth,client auth")
	f.Add(" Digital Signature , SERVER AUTH,server auth")
	f.Add("cert sign,crl sign,any,code signing,email protection,s/mime,ipsec end system,ipsec tunnel,ipsec user,timestamping,ocsp signing,microsoft sgc,netscape sgc")
	f.Add("key agreement,encipher only,decipher only,content commitment,data encipherment,key encipherment")
	f.Add("server auth,,")
	f.Add("serverAuth")
	f.Add("")
	f.Fuzz(func(t *testing.T, list string) {
		names := strings.Split(list, ",")
		u, err := csr.ParseUsages(names)
		if err != nil {
			var cerr *csr.Error
			if !errors.As(err, &cerr) || cerr.Reason != csr.ReasonUnknownUse || cerr.Detail == "" {
				t.Fatalf("error %v (%T) is not a *csr.Error of reason %s", err, err, csr.ReasonUnknownUse)
			}
			return
		}
		for i := 1; i < len(u.Ext); i++ {
			if u.Ext[i-1] >= u.Ext[i] {
				t.Fatalf("extended key usages %v are not sorted without duplicates", u.Ext)
			}
		}
		again, err := csr.ParseUsages(u.Strings())
		if err != nil {
			t.Fatalf("canonical names %q do not parse: %v", u.Strings(), err)
		}
		if again.Key != u.Key || !reflect.DeepEqual(again.Ext, u.Ext) {
			t.Fatalf("%q parsed as %+v, its canonical names %q as %+v", list, u, u.Strings(), again)
		}
		if extra, ok := u.Subset(again); !ok {
			t.Fatalf("usages are not a subset of themselves: %v", extra)
		}
	})
}
