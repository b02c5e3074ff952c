package pemutil_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
)

func TestPrivateKeyRoundTrip(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	tests := []struct {
		name string
		pem  []byte
		want string
	}{
		{"pkcs8", mustEncode(t, ec), ""},
		{"sec1", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}), ""},
		{"pkcs1", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}), ""},
		{"empty", nil, "no PEM data"},
		{"cert block", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), "want a private key"},
		{"two blocks", append(mustEncode(t, ec), mustEncode(t, ec)...), "more than one PEM block"},
		{"explanatory text before", append([]byte("# the CA key\n"), mustEncode(t, ec)...), ""},
		{"damaged block before a good one", append([]byte("-----BEGIN PRIVATE KEY-----\n!!!\n-----END PRIVATE KEY-----\n"), mustEncode(t, ec)...),
			`line 1: "-----BEGIN PRIVATE KEY-----" begins a PEM block that does not decode`},
		{"damaged block alone", []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n"), `line 1: "-----BEGIN PRIVATE KEY-----" begins a PEM block that does not decode`},
		{"stray END before the key", append([]byte("-----END PRIVATE KEY-----\n"), mustEncode(t, ec)...), `line 1: "-----END PRIVATE KEY-----" ends no PEM block`},
		// A key pasted on one line, its newlines written as \n (a Helm or
		// Secret mistake): the error names the boundary, never key bytes.
		{"key on one line", oneLine(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})),
			`line 1: "-----BEGIN EC PRIVATE KEY-----" begins a PEM block that does not decode`},
		{"key on one line, no closing dashes", []byte("-----BEGIN EC PRIVATE KEY" + base64.StdEncoding.EncodeToString(sec1)),
			`line 1: "-----BEGIN..." begins a PEM block that does not decode`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pemutil.ParsePrivateKey(tt.pem)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if body := base64.StdEncoding.EncodeToString(sec1); strings.Contains(err.Error(), body[:12]) {
				t.Fatalf("err = %v: it quotes the key", err)
			}
		})
	}
}

// TestParseCertificates: certificates with explanatory text around them
// parse; a block that does not decode, a block of another type or with
// headers, and data without a block are refused with an error that says
// where.
func TestParseCertificates(t *testing.T) {
	root, rootKey := fuzzCA(t, "root", nil, nil)
	inter, _ := fuzzCA(t, "intermediate", root, rootKey)
	one := string(pemutil.EncodeCertificates(root))
	chain := string(pemutil.EncodeCertificates(inter, root))
	n := strings.Count(one, "\n") // lines of one certificate
	// damaged is one with a character base64 does not have in its body.
	damaged := strings.Replace(one, "\nMII", "\n!MII", 1)
	key := "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	undecodable := `"-----BEGIN CERTIFICATE-----" begins a PEM block that does not decode (bad base64 or no matching END line)`
	tests := []struct {
		name   string
		in     string
		certs  int
		want   string // the error, or its start when prefix is set
		prefix bool
		noPEM  bool // the error is ErrNoPEM
	}{
		{name: "one", in: one, certs: 1},
		{name: "chain", in: chain, certs: 2},
		{name: "white space around", in: "\n\n" + chain + "\n \t\n", certs: 2},
		{name: "CRLF", in: strings.ReplaceAll(chain, "\n", "\r\n"), certs: 2},
		{name: "comment before", in: "# roots of cluster.local\n" + one, certs: 1},
		{name: "CA bundle names between", in: "Root A\n======\n" + one + "\nRoot B\n======\n" + one, certs: 2},
		{name: "openssl pkcs12 bag attributes", in: "Bag Attributes\n    friendlyName: root\nsubject=CN = root\nissuer=CN = root\n" + one, certs: 1},
		{name: "text after", in: one + "end of bundle\n", certs: 1},

		{name: "empty", in: "", want: "no PEM data", noPEM: true},
		{name: "white space", in: " \n\t\n", want: "no PEM data", noPEM: true},
		{name: "text only", in: "junk", want: "no PEM data: the input is text that is not PEM", noPEM: true},
		{name: "damaged first block", in: damaged + one,
			want: "line 1: " + undecodable},
		{name: "damaged middle block", in: one + damaged + one,
			want: fmt.Sprintf("line %d: %s", n+1, undecodable)},
		{name: "damaged last block", in: chain + damaged,
			want: fmt.Sprintf("line %d: %s", strings.Count(chain, "\n")+1, undecodable)},
		{name: "damaged only block", in: damaged, want: "line 1: " + undecodable},
		{name: "truncated", in: one + one[:len(one)/2],
			want: fmt.Sprintf("line %d: %s", n+1, undecodable)},
		{name: "no END line before a block", in: strings.TrimSuffix(one, "-----END CERTIFICATE-----\n") + one,
			want: "line 1: " + undecodable},
		{name: "mismatched END line", in: strings.Replace(one, "END CERTIFICATE", "END X509 CRL", 1) + one,
			want: "line 1: " + undecodable},
		{name: "indented block", in: "  " + one,
			want: `line 1: "-----BEGIN CERTIFICATE-----" begins a PEM block that does not decode (its BEGIN is not at the start of the line)`},
		{name: "BEGIN in text", in: "the chain: -----BEGIN CERTIFICATE-----\n\n" + one,
			want: `line 1: "-----BEGIN CERTIFICATE-----" begins a PEM block that does not decode (its BEGIN is not at the start of the line)`},
		{name: "END without BEGIN", in: one + "-----END CERTIFICATE-----\n",
			want: fmt.Sprintf(`line %d: "-----END CERTIFICATE-----" ends no PEM block`, n+1)},
		{name: "private key", in: key, want: `line 1: PEM block 1 is "PRIVATE KEY", want "CERTIFICATE"`},
		{name: "private key after a certificate", in: "# root\n" + one + key,
			want: fmt.Sprintf(`line %d: PEM block 2 is "PRIVATE KEY", want "CERTIFICATE"`, n+2)},
		{name: "headers", in: string(pem.EncodeToMemory(&pem.Block{Type: pemutil.TypeCertificate, Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: root.Raw})),
			want: "line 1: PEM block 1 has headers; a certificate has none"},
		{name: "not a certificate", in: one + string(pem.EncodeToMemory(&pem.Block{Type: pemutil.TypeCertificate, Bytes: root.Raw[:len(root.Raw)/2]})),
			want: fmt.Sprintf("line %d: certificate 2: x509: ", n+1), prefix: true},
		{name: "empty block", in: "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
			want: "line 1: certificate 1: x509: ", prefix: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			certs, err := pemutil.ParseCertificates([]byte(tt.in))
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(certs) != tt.certs {
					t.Fatalf("%d certificates, want %d", len(certs), tt.certs)
				}
				return
			}
			switch {
			case err == nil:
				t.Fatalf("accepted, %d certificates; want %q", len(certs), tt.want)
			case certs != nil:
				t.Fatalf("certificates along with %v", err)
			case tt.prefix && !strings.HasPrefix(err.Error(), tt.want), !tt.prefix && err.Error() != tt.want:
				t.Fatalf("err = %q\nwant    %q", err, tt.want)
			case errors.Is(err, pemutil.ErrNoPEM) != tt.noPEM:
				t.Fatalf("errors.Is(%v, ErrNoPEM) = %v", err, !tt.noPEM)
			}
		})
	}
}

func mustEncode(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	b, err := pemutil.EncodePrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzParse(f *testing.F) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := pemutil.EncodePrivateKey(k)
	f.Add(b)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = pemutil.ParseCertificates(data)
		_, _ = pemutil.ParsePrivateKey(data)
	})
}

// oneLine is p with its newlines written as the two characters \ and n.
func oneLine(p []byte) []byte {
	return bytes.ReplaceAll(bytes.TrimSpace(p), []byte("\n"), []byte(`\n`))
}
