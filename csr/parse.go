package csr

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"strings"
)

// MaxPEMSize is the largest PEM request Parse accepts. An RSA-8192 CSR is
// about 2.5 KiB of PEM; 16 KiB leaves room without inviting abuse.
const MaxPEMSize = 16 << 10

// PEM block types accepted for a certificate request.
const (
	pemType       = "CERTIFICATE REQUEST"
	pemTypeLegacy = "NEW CERTIFICATE REQUEST"
)

// Parse decodes exactly one PEM PKCS#10 request and verifies its signature.
// Anything but white space around the block is refused.
func Parse(data []byte) (*x509.CertificateRequest, error) {
	return ParseFor(data, nil)
}

// ParseFor is Parse that, when keys is not nil, refuses a key keys does
// not allow before it verifies the signature: an attacker's RSA-16384
// request costs a parse, not a 16384-bit verification.
func ParseFor(data []byte, keys *KeyPolicy) (*x509.CertificateRequest, error) {
	if len(data) > MaxPEMSize {
		return nil, errorf(ReasonTooLarge, "CSR is %d bytes, the limit is %d", len(data), MaxPEMSize)
	}
	block, rest := pem.Decode(data)
	switch {
	case block == nil:
		return nil, errorf(ReasonMalformed, "no PEM block found")
	case block.Type != pemType && block.Type != pemTypeLegacy:
		return nil, errorf(ReasonMalformed, "PEM block is %q, want %q", block.Type, pemType)
	case len(block.Headers) != 0:
		return nil, errorf(ReasonMalformed, "PEM block has headers")
	case !startsWithBlock(data, rest):
		return nil, errorf(ReasonMalformed, "data before the CSR: send exactly one PEM block")
	case len(bytes.TrimSpace(rest)) != 0:
		return nil, errorf(ReasonMalformed, "data after the CSR: send exactly one PEM block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, &Error{Reason: ReasonMalformed, Detail: "cannot parse PKCS#10: " + parseFailure(err), Err: err}
	}
	if keys != nil {
		if err := keys.Check(req.PublicKey); err != nil {
			return nil, err
		}
	}
	if err := req.CheckSignature(); err != nil {
		return nil, errorf(ReasonSignature, "CSR signature does not verify: %v", err)
	}
	return req, nil
}

// startsWithBlock reports whether the block pem.Decode found in data, which
// left rest, is the first thing in data after white space. pem.Decode skips
// anything before a BEGIN line, including blocks it cannot decode; base64
// has no '-', so the decoded part holds one BEGIN and one END line only if
// nothing was skipped.
func startsWithBlock(data, rest []byte) bool {
	consumed := data[:len(data)-len(rest)]
	return bytes.HasPrefix(bytes.TrimSpace(consumed), []byte("-----BEGIN ")) &&
		bytes.Count(consumed, []byte("-----BEGIN")) == 1 &&
		bytes.Count(consumed, []byte("-----END")) == 1
}

// parseFailure says, in words fit for the client, why crypto/x509 could
// not parse a request. encoding/asn1's structure errors print the field
// parameters of the Go struct they decode into, pointers included ("tags
// don't match (16 vs {...}) {... tag:0xc000...} tbsCertificateRequest
// @2"): the client gets what went wrong and where; the whole text goes to
// the log through Error.Err.
func parseFailure(err error) string {
	var se asn1.StructuralError
	if !errors.As(err, &se) {
		return err.Error()
	}
	msg := se.Msg
	if i := strings.Index(msg, " ("); i >= 0 {
		what := msg[:i]
		if j := strings.LastIndex(msg, "} "); j > i {
			what += " in " + msg[j+2:]
		}
		msg = what
	}
	return "asn1: structure error: " + msg
}
