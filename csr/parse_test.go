package csr_test

import (
	"bytes"
	"encoding/pem"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/meshca/meshca/csr"
)

func TestParse(t *testing.T) {
	valid := ztunnelPEM(t, p256Key(), testID)
	validDER := pemDER(t, valid)

	// A valid request whose signature no longer matches: one byte of the
	// signature value is flipped and the request encoded again.
	r := splitCSR(t, validDER)
	r.Signature.Bytes[len(r.Signature.Bytes)-1] ^= 0x01
	badSig := pemCSR(r.marshal(t))

	headers := pem.EncodeToMemory(&pem.Block{
		Type:    "CERTIFICATE REQUEST",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"},
		Bytes:   validDER,
	})
	legacy := pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: validDER})
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: validDER})

	// Padding with white space keeps the request valid, so only the size
	// decides.
	pad := func(n int) []byte {
		return append(append([]byte{}, valid...), bytes.Repeat([]byte("\n"), n-len(valid))...)
	}

	tests := []struct {
		name   string
		data   []byte
		reason csr.Reason
		detail string
	}{
		{name: "valid", data: valid},
		{name: "legacy PEM type", data: legacy},
		{name: "white space around the block", data: []byte("\n\r\n" + string(valid) + "\n \t\n")},
		{name: "exactly MaxPEMSize", data: pad(csr.MaxPEMSize)},
		{name: "empty", data: nil, reason: csr.ReasonMalformed, detail: "no PEM block"},
		{name: "white space only", data: []byte(" \n\t"), reason: csr.ReasonMalformed, detail: "no PEM block"},
		{name: "not PEM", data: []byte("hello, CA"), reason: csr.ReasonMalformed, detail: "no PEM block"},
		{name: "bare DER", data: validDER, reason: csr.ReasonMalformed, detail: "no PEM block"},
		{name: "no END line", data: valid[:bytes.Index(valid, []byte("-----END"))], reason: csr.ReasonMalformed, detail: "no PEM block"},
		{name: "wrong PEM type", data: cert, reason: csr.ReasonMalformed, detail: `PEM block is "CERTIFICATE"`},
		{name: "PEM headers", data: headers, reason: csr.ReasonMalformed, detail: "headers"},
		{name: "two blocks", data: append(append([]byte{}, valid...), valid...), reason: csr.ReasonMalformed, detail: "data after the CSR"},
		{name: "trailing garbage", data: append(append([]byte{}, valid...), "garbage"...), reason: csr.ReasonMalformed, detail: "data after the CSR"},
		{name: "leading garbage", data: append([]byte("garbage\n"), valid...), reason: csr.ReasonMalformed, detail: "data before the CSR"},
		{name: "leading certificate", data: append(append([]byte{}, cert...), valid...), reason: csr.ReasonMalformed, detail: `PEM block is "CERTIFICATE"`},
		{name: "leading broken block", data: append([]byte("-----BEGIN CERTIFICATE REQUEST-----\n!!\n-----END CERTIFICATE REQUEST-----\n"), valid...), reason: csr.ReasonMalformed, detail: "data before the CSR"},
		{name: "leading BEGIN line", data: append([]byte("-----BEGIN CERTIFICATE REQUEST-----\n"), valid...), reason: csr.ReasonMalformed, detail: "data before the CSR"},
		{name: "oversize", data: pad(csr.MaxPEMSize + 1), reason: csr.ReasonTooLarge, detail: "limit is 16384"},
		{name: "corrupt DER", data: pemCSR([]byte("not DER at all")), reason: csr.ReasonMalformed, detail: "cannot parse PKCS#10: asn1: structure error: tags don't match in certificateRequest @2"},
		{name: "indefinite length", data: pemCSR([]byte{0x30, 0x80}), reason: csr.ReasonMalformed, detail: "cannot parse PKCS#10: asn1: syntax error: indefinite length found (not DER)"},
		{name: "truncated DER", data: pemCSR(validDER[:len(validDER)-10]), reason: csr.ReasonMalformed, detail: "cannot parse PKCS#10"},
		{name: "trailing bytes after DER", data: pemCSR(append(append([]byte{}, validDER...), 0)), reason: csr.ReasonMalformed, detail: "cannot parse PKCS#10"},
		{name: "bad signature", data: badSig, reason: csr.ReasonSignature, detail: "does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := csr.Parse(tt.data)
			requireReason(t, err, tt.reason, tt.detail)
			if tt.reason != "" {
				if req != nil {
					t.Fatalf("Parse returned a request along with error %v", err)
				}
				return
			}
			if len(req.URIs) != 1 || req.URIs[0].String() != testID.String() {
				t.Fatalf("URIs = %v, want [%s]", req.URIs, testID)
			}
		})
	}
}

// TestParseKeys checks that Parse verifies the signature of every kind of
// key a workload may use, and that even an RSA-8192 request fits the size
// limit.
func TestParseKeys(t *testing.T) {
	for _, tt := range []struct {
		name string
		data func(t *testing.T) []byte
	}{
		{"ECDSA P-256", func(t *testing.T) []byte { return ztunnelPEM(t, p256Key(), testID) }},
		{"ECDSA P-384", func(t *testing.T) []byte { return ztunnelPEM(t, p384Key(), testID) }},
		{"ECDSA P-521", func(t *testing.T) []byte { return ztunnelPEM(t, p521Key(), testID) }},
		{"Ed25519", func(t *testing.T) []byte { return ztunnelPEM(t, ed25519Key(), testID) }},
		{"RSA-2048", func(t *testing.T) []byte { return ztunnelPEM(t, rsa2048Key(), testID) }},
		{"RSA-8192", func(t *testing.T) []byte { return ztunnelPEM(t, rsa8192Key(), testID) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data := tt.data(t)
			if len(data) > csr.MaxPEMSize/2 {
				t.Errorf("request is %d bytes, more than half of MaxPEMSize", len(data))
			}
			req := mustParse(t, data)
			if err := req.CheckSignature(); err != nil {
				t.Fatalf("CheckSignature: %v", err)
			}
		})
	}
}

func TestBuild(t *testing.T) {
	data := ztunnelPEM(t, p256Key(), testID)
	if !strings.HasPrefix(string(data), "-----BEGIN CERTIFICATE REQUEST-----\n") {
		t.Fatalf("Build output does not start with a CERTIFICATE REQUEST block:\n%s", data)
	}
	req := mustParse(t, data)
	if len(req.Subject.Names) != 0 {
		t.Errorf("subject = %v, want empty", req.Subject)
	}
	if len(req.Extensions) != 1 {
		t.Fatalf("got %d extensions, want 1", len(req.Extensions))
	}
	if ext := req.Extensions[0]; !ext.Id.Equal(oidSAN) || !ext.Critical {
		t.Errorf("extension = %v (critical %t), want a critical subjectAltName", ext.Id, ext.Critical)
	}
	if len(req.URIs) != 1 || req.URIs[0].String() != testID.String() {
		t.Errorf("URIs = %v, want [%s]", req.URIs, testID)
	}
	if got := req.SignatureAlgorithm.String(); got != "ECDSA-SHA256" {
		t.Errorf("signature algorithm = %s, want ECDSA-SHA256", got)
	}
}

func pemDER(t testing.TB, data []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM block")
	}
	return block.Bytes
}

// TestParseForChecksTheKeyFirst: a key the policy refuses is refused as
// such, before its signature is verified (a forged RSA request must not
// cost a verification of its size).
func TestParseForChecksTheKeyFirst(t *testing.T) {
	data := ztunnelPEM(t, rsa2048Key(), testID)
	block, _ := pem.Decode(data)
	block.Bytes[len(block.Bytes)-1] ^= 0xff // break the signature
	broken := pem.EncodeToMemory(block)
	ecOnly, err := csr.ParseKeyPolicy("ecdsa-p256")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		keys *csr.KeyPolicy
		want csr.Reason
	}{
		{"no key policy: the signature", nil, csr.ReasonSignature},
		{"a policy that allows the key: the signature", &csr.KeyPolicy{RSAMinBits: 2048, RSAMaxBits: 4096}, csr.ReasonSignature},
		{"a policy that refuses the key: the key", &ecOnly, csr.ReasonKey},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := csr.ParseFor(broken, tt.keys)
			var ce *csr.Error
			if !errors.As(err, &ce) || ce.Reason != tt.want {
				t.Fatalf("ParseFor = %v, want reason %s", err, tt.want)
			}
		})
	}
}

// TestParseDetailIsForClients damages every byte of a valid request in
// turn: whatever crypto/x509 says of the result, the client's detail never
// holds what encoding/asn1 prints of its own Go structs (field parameters,
// pointers), which the log keeps.
func TestParseDetailIsForClients(t *testing.T) {
	der := pemDER(t, ztunnelPEM(t, p256Key(), testID))
	leaky := regexp.MustCompile(`0x[0-9a-f]|\{|optional:|defaultValue`)
	seen := 0
	for i := range der {
		for _, v := range []byte{0x00, 0x05, 0xa1, 0xff} {
			bad := append([]byte{}, der...)
			bad[i] = v
			_, err := csr.Parse(pemCSR(bad))
			var cerr *csr.Error
			if !errors.As(err, &cerr) || cerr.Reason != csr.ReasonMalformed {
				continue
			}
			seen++
			if leaky.MatchString(cerr.Detail) {
				t.Fatalf("byte %d set to %#x: detail %q shows encoding/asn1's internals", i, v, cerr.Detail)
			}
			if cerr.Err == nil || !strings.Contains(err.Error(), cerr.Err.Error()) {
				t.Fatalf("byte %d set to %#x: Error() = %q does not keep the parser's error for the log", i, v, err)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no damaged request was refused as malformed")
	}
}
