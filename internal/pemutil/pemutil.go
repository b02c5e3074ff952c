// Package pemutil encodes and decodes the PEM forms of certificates and
// private keys that meshca reads and writes.
package pemutil

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// Block types.
const (
	TypeCertificate = "CERTIFICATE"
	TypePrivateKey  = "PRIVATE KEY"
	typeECKey       = "EC PRIVATE KEY"
	typeRSAKey      = "RSA PRIVATE KEY"
)

// ErrNoPEM is returned when the input holds no PEM block at all.
var ErrNoPEM = errors.New("no PEM data")

// Encapsulation boundaries (RFC 7468, section 2). Base64 has no '-', so
// in a block that decodes they occur on its BEGIN and END lines only.
var (
	beginMark = []byte("-----BEGIN")
	endMark   = []byte("-----END")
)

// ParseCertificates returns every certificate in data, in order: data
// holds one or more CERTIFICATE blocks (RFC 7468), each without headers
// and holding one X.509 certificate, and may hold explanatory text before,
// between and after them, as openssl, CA bundles and Kubernetes'
// status.certificate do (RFC 7468, section 5.2). The text is ignored; but
// text holding a BEGIN or END boundary is a block that does not decode,
// damaged or truncated, and data holding one is refused, as are blocks of
// any other type: no certificate is dropped without an error. encoding/pem
// alone skips such blocks and returns the next one that decodes.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		block, next := pem.Decode(rest)
		if block == nil {
			break
		}
		// pem.Decode skipped rest[:at]; the block begins at its BEGIN
		// line, the last boundary it consumed that is one.
		consumed := rest[:len(rest)-len(next)]
		at := bytes.LastIndex(consumed, beginMark)
		pos := len(data) - len(rest) // of rest in data
		if err := checkText(data, pos, pos+at); err != nil {
			return nil, err
		}
		n := len(certs) + 1
		switch {
		case block.Type != TypeCertificate:
			return nil, fmt.Errorf("line %d: PEM block %d is %q, want %q", lineOf(data, pos+at), n, block.Type, TypeCertificate)
		case len(block.Headers) != 0:
			return nil, fmt.Errorf("line %d: PEM block %d has headers; a certificate has none", lineOf(data, pos+at), n)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("line %d: certificate %d: %w", lineOf(data, pos+at), n, err)
		}
		certs = append(certs, c)
		rest = next
	}
	if err := checkText(data, len(data)-len(rest), len(data)); err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		if len(bytes.TrimSpace(data)) != 0 {
			return nil, fmt.Errorf("%w: the input is text that is not PEM", ErrNoPEM)
		}
		return nil, ErrNoPEM
	}
	return certs, nil
}

// checkText refuses data[from:to], text outside the blocks that decode,
// if it holds a boundary: the BEGIN line of a block that does not decode
// (bad base64, a missing or mismatched END line, a BEGIN line that does
// not start its line) or an END line without its block.
func checkText(data []byte, from, to int) error {
	text := data[from:to]
	b, e := bytes.Index(text, beginMark), bytes.Index(text, endMark)
	switch {
	case b >= 0 && (e < 0 || b < e):
		at, why := from+b, "bad base64 or no matching END line"
		if at > 0 && data[at-1] != '\n' {
			why = "its BEGIN is not at the start of the line"
		}
		return fmt.Errorf("line %d: %q begins a PEM block that does not decode (%s)", lineOf(data, at), boundaryAt(data, at), why)
	case e >= 0:
		return fmt.Errorf("line %d: %q ends no PEM block", lineOf(data, from+e), boundaryAt(data, from+e))
	}
	return nil
}

// lineOf returns the number, from 1, of the line of data that holds
// data[i].
func lineOf(data []byte, i int) int {
	return bytes.Count(data[:i], []byte("\n")) + 1
}

// boundaryAt returns the PEM boundary that starts at data[i] (a BEGIN or
// END mark), for an error: its own text only, up to its closing dashes,
// never what follows it on the line or precedes it, which may be a key
// written on one line. Without closing dashes in the first 64 bytes it is
// the mark alone.
func boundaryAt(data []byte, i int) string {
	line := data[i:]
	if end := bytes.IndexByte(line, '\n'); end >= 0 {
		line = line[:end]
	}
	mark := beginMark
	if bytes.HasPrefix(line, endMark) {
		mark = endMark
	}
	line = line[:min(len(line), 64)]
	if k := bytes.Index(line[len(mark):], []byte("-----")); k >= 0 {
		return string(line[:len(mark)+k+5])
	}
	return string(mark) + "..."
}

// EncodeCertificates returns the concatenated PEM of certs.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: TypeCertificate, Bytes: c.Raw})
	}
	return buf.Bytes()
}

// ParsePrivateKey decodes one PEM private key in PKCS#8, SEC 1 (EC) or
// PKCS#1 (RSA) form.
func ParsePrivateKey(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		if err := checkText(data, 0, len(data)); err != nil {
			return nil, err
		}
		return nil, ErrNoPEM
	}
	// As in ParseCertificates: a damaged block pem.Decode skipped before
	// this one is refused, not passed over for the next key.
	at := bytes.LastIndex(data[:len(data)-len(rest)], beginMark)
	if err := checkText(data, 0, at); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("more than one PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case TypePrivateKey:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case typeECKey:
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case typeRSAKey:
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block is %q, want a private key", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
		return k.(crypto.Signer), nil
	default:
		return nil, fmt.Errorf("unsupported private key type %T", key)
	}
}

// EncodePrivateKey returns key as PKCS#8 PEM.
func EncodePrivateKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: TypePrivateKey, Bytes: der}), nil
}
