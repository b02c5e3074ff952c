package csr_test

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"math/big"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
)

// vocabulary is every name of the cert-manager/cfssl vocabulary with the
// x509 value it stands for.
var vocabulary = []struct {
	name string
	want csr.Usages
}{
	{"signing", csr.Usages{Key: x509.KeyUsageDigitalSignature}},
	{"digital signature", csr.Usages{Key: x509.KeyUsageDigitalSignature}},
	{"content commitment", csr.Usages{Key: x509.KeyUsageContentCommitment}},
	{"key encipherment", csr.Usages{Key: x509.KeyUsageKeyEncipherment}},
	{"key agreement", csr.Usages{Key: x509.KeyUsageKeyAgreement}},
	{"data encipherment", csr.Usages{Key: x509.KeyUsageDataEncipherment}},
	{"cert sign", csr.Usages{Key: x509.KeyUsageCertSign}},
	{"crl sign", csr.Usages{Key: x509.KeyUsageCRLSign}},
	{"encipher only", csr.Usages{Key: x509.KeyUsageEncipherOnly}},
	{"decipher only", csr.Usages{Key: x509.KeyUsageDecipherOnly}},
	{"any", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}},
	{"server auth", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}},
	{"client auth", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}},
	{"code signing", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}}},
	{"email protection", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageEmailProtection}}},
	{"s/mime", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageEmailProtection}}},
	{"ipsec end system", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageIPSECEndSystem}}},
	{"ipsec tunnel", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageIPSECTunnel}}},
	{"ipsec user", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageIPSECUser}}},
	{"timestamping", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageTimeStamping}}},
	{"ocsp signing", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageOCSPSigning}}},
	{"microsoft sgc", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageMicrosoftServerGatedCrypto}}},
	{"netscape sgc", csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageNetscapeServerGatedCrypto}}},
}

// aliases maps the names that are not canonical to their canonical name.
var aliases = map[string]string{
	"signing": "digital signature",
	"s/mime":  "email protection",
}

// canonicalOrder is every canonical name in the order Names returns them:
// keyUsage bits in bit order, then extended key usages in vocabulary order.
var canonicalOrder = []csr.Usage{
	"digital signature",  // bit 0
	"content commitment", // bit 1
	"key encipherment",   // bit 2
	"data encipherment",  // bit 3
	"key agreement",      // bit 4
	"cert sign",          // bit 5
	"crl sign",           // bit 6
	"encipher only",      // bit 7
	"decipher only",      // bit 8
	"any",
	"server auth",
	"client auth",
	"code signing",
	"email protection",
	"ipsec end system",
	"ipsec tunnel",
	"ipsec user",
	"timestamping",
	"ocsp signing",
	"microsoft sgc",
	"netscape sgc",
}

func TestParseUsagesVocabulary(t *testing.T) {
	for _, v := range vocabulary {
		t.Run(v.name, func(t *testing.T) {
			for _, spelling := range []string{v.name, " " + upper(v.name) + "\t"} {
				got, err := csr.ParseUsages([]string{spelling})
				if err != nil {
					t.Fatalf("ParseUsages(%q): %v", spelling, err)
				}
				if !reflect.DeepEqual(got, v.want) {
					t.Fatalf("ParseUsages(%q) = %+v, want %+v", spelling, got, v.want)
				}
			}
			// The Usage constant spells the name the same way.
			if !slices.Contains(canonicalOrder, csr.Usage(v.name)) && aliases[v.name] == "" {
				t.Fatalf("%q is neither canonical nor an alias", v.name)
			}
		})
	}
}

func TestParseUsages(t *testing.T) {
	tests := []struct {
		name  string
		names []string
		want  csr.Usages
	}{
		{"nil", nil, csr.Usages{}},
		{"empty", []string{}, csr.Usages{}},
		{"workload ECDSA", []string{"digital signature", "server auth", "client auth"}, csr.Usages{
			Key: x509.KeyUsageDigitalSignature,
			Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}},
		{"extended key usages are sorted and without duplicates", []string{
			"email protection", "client auth", "s/mime", "server auth", "client auth", "Server Auth",
		}, csr.Usages{
			Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageEmailProtection},
		}},
		{"aliases set one bit", []string{"signing", "digital signature", "key encipherment"}, csr.Usages{
			Key: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := csr.ParseUsages(tt.names)
			if err != nil {
				t.Fatalf("ParseUsages(%q): %v", tt.names, err)
			}
			if got.Key != tt.want.Key || !slices.Equal(got.Ext, tt.want.Ext) {
				t.Fatalf("ParseUsages(%q) = %+v, want %+v", tt.names, got, tt.want)
			}
		})
	}
}

func TestParseUsagesUnknown(t *testing.T) {
	for _, names := range [][]string{
		{""},
		{"   "},
		{"digitalsignature"},
		{"digital-signature"},
		{"server-auth"},
		{"serverAuth"},
		{"cert signing"},
		{"ocsp"},
		{"1.3.6.1.5.5.7.3.1"},
		{"server auth", "client auth", "bogus"},
	} {
		bad := names[len(names)-1]
		t.Run(bad, func(t *testing.T) {
			got, err := csr.ParseUsages(names)
			requireReason(t, err, csr.ReasonUnknownUse, `unknown key usage "`+bad+`"`)
			if !reflect.DeepEqual(got, csr.Usages{}) {
				t.Fatalf("ParseUsages(%q) returned %+v along with an error", names, got)
			}
		})
	}
}

func TestUsagesNames(t *testing.T) {
	// Every name alone round-trips to its canonical name.
	for _, v := range vocabulary {
		t.Run(v.name, func(t *testing.T) {
			want := v.name
			if c, ok := aliases[v.name]; ok {
				want = c
			}
			u, err := csr.ParseUsages([]string{v.name})
			if err != nil {
				t.Fatal(err)
			}
			if got := u.Names(); !slices.Equal(got, []csr.Usage{csr.Usage(want)}) {
				t.Fatalf("Names() = %q, want [%q]", got, want)
			}
			if got := u.Strings(); !slices.Equal(got, []string{want}) {
				t.Fatalf("Strings() = %q, want [%q]", got, want)
			}
		})
	}

	t.Run("all names", func(t *testing.T) {
		var all []string
		for i := len(vocabulary) - 1; i >= 0; i-- { // reverse order on purpose
			all = append(all, vocabulary[i].name)
		}
		u, err := csr.ParseUsages(all)
		if err != nil {
			t.Fatal(err)
		}
		names := u.Names()
		if !slices.Equal(names, canonicalOrder) {
			t.Fatalf("Names() = %q, want %q", names, canonicalOrder)
		}
		// names -> Usages -> Names is stable.
		again, err := csr.ParseUsages(u.Strings())
		if err != nil {
			t.Fatal(err)
		}
		if again.Key != u.Key || !slices.Equal(again.Ext, u.Ext) {
			t.Fatalf("round trip gave %+v, want %+v", again, u)
		}
		if !slices.Equal(again.Names(), names) {
			t.Fatalf("round trip Names() = %q, want %q", again.Names(), names)
		}
	})

	t.Run("empty", func(t *testing.T) {
		if got := (csr.Usages{}).Names(); len(got) != 0 {
			t.Fatalf("Names() = %q, want none", got)
		}
		if got := (csr.Usages{}).Strings(); len(got) != 0 {
			t.Fatalf("Strings() = %q, want none", got)
		}
	})

	t.Run("extended key usage outside the vocabulary is left out", func(t *testing.T) {
		u := csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageMicrosoftKernelCodeSigning}}
		if got, want := u.Names(), []csr.Usage{csr.UsageServerAuth}; !slices.Equal(got, want) {
			t.Fatalf("Names() = %q, want %q", got, want)
		}
	})

	t.Run("undefined keyUsage bits are left out", func(t *testing.T) {
		u := csr.Usages{Key: x509.KeyUsageCRLSign | 1<<12}
		if got, want := u.Names(), []csr.Usage{csr.UsageCRLSign}; !slices.Equal(got, want) {
			t.Fatalf("Names() = %q, want %q", got, want)
		}
	})
}

func TestUsagesSubset(t *testing.T) {
	parse := func(names ...string) csr.Usages {
		u, err := csr.ParseUsages(names)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	workload := parse("digital signature", "server auth", "client auth")

	tests := []struct {
		name     string
		u        csr.Usages
		allowed  csr.Usages
		wantOK   bool
		wantExtr []csr.Usage
	}{
		{"empty in empty", csr.Usages{}, csr.Usages{}, true, nil},
		{"empty in workload", csr.Usages{}, workload, true, nil},
		{"equal", workload, workload, true, nil},
		{"one of each", parse("signing", "client auth"), workload, true, nil},
		{"alias of an allowed usage", parse("s/mime"), parse("email protection"), true, nil},
		{"extra key bit", parse("digital signature", "cert sign"), workload, false, []csr.Usage{"cert sign"}},
		{"extra key bits in bit order", parse("crl sign", "key agreement", "data encipherment", "digital signature"), workload, false,
			[]csr.Usage{"data encipherment", "key agreement", "crl sign"}},
		{"extra extended usage", parse("server auth", "code signing"), workload, false, []csr.Usage{"code signing"}},
		{"extra alias gives the canonical name", parse("s/mime"), workload, false, []csr.Usage{"email protection"}},
		{"any is not every usage", workload, parse("any"), false, []csr.Usage{"digital signature", "server auth", "client auth"}},
		{"key bits before extended usages", parse("ocsp signing", "key encipherment"), workload, false, []csr.Usage{"key encipherment", "ocsp signing"}},
		{"everything in empty", parse("digital signature", "server auth"), csr.Usages{}, false, []csr.Usage{"digital signature", "server auth"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			extra, ok := tt.u.Subset(tt.allowed)
			if ok != tt.wantOK || !slices.Equal(extra, tt.wantExtr) {
				t.Fatalf("Subset() = %q, %t; want %q, %t", extra, ok, tt.wantExtr, tt.wantOK)
			}
		})
	}

	t.Run("extended usage outside the vocabulary", func(t *testing.T) {
		u := csr.Usages{Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageMicrosoftKernelCodeSigning}}
		if extra, ok := u.Subset(workload); ok || len(extra) != 1 {
			t.Fatalf("Subset() = %q, %t; want one extra usage", extra, ok)
		}
	})
}

// TestExtKeyUsageOID checks every extended key usage of the vocabulary
// against the OID crypto/x509 writes into a certificate for it.
func TestExtKeyUsageOID(t *testing.T) {
	key := p256Key()
	for _, v := range vocabulary {
		if len(v.want.Ext) == 0 {
			continue
		}
		eku := v.want.Ext[0]
		t.Run(v.name, func(t *testing.T) {
			got, ok := csr.ExtKeyUsageOID(eku)
			if !ok {
				t.Fatalf("ExtKeyUsageOID(%v) not found", eku)
			}
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(1),
				NotBefore:    time.Now(),
				NotAfter:     time.Now().Add(time.Hour),
				ExtKeyUsage:  []x509.ExtKeyUsage{eku},
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			for _, ext := range cert.Extensions {
				if !ext.Id.Equal(oidExtKeyUsage) {
					continue
				}
				var oids []asn1.ObjectIdentifier
				if _, err := asn1.Unmarshal(ext.Value, &oids); err != nil {
					t.Fatal(err)
				}
				if len(oids) != 1 || !oids[0].Equal(got) {
					t.Fatalf("ExtKeyUsageOID(%v) = %v, x509 writes %v", eku, got, oids)
				}
				return
			}
			t.Fatal("x509 wrote no extKeyUsage")
		})
	}
	t.Run("outside the vocabulary", func(t *testing.T) {
		if oid, ok := csr.ExtKeyUsageOID(x509.ExtKeyUsageMicrosoftCommercialCodeSigning); ok {
			t.Fatalf("ExtKeyUsageOID(MicrosoftCommercialCodeSigning) = %v, want none", oid)
		}
	})
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
