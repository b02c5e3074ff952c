package keymgr

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/pemutil"
)

// The key entries of an encoded CA state: one PKCS#8 PEM private key
// each, named for its certificate.

// KeyEntry is the name of the entry that holds the private key of the
// certificate c (an authority's Cert, which is its Root unless an
// intermediate signs): "key-" and the first 16 hex digits of c's
// fingerprint, ".pem". Naming a key by its certificate means an entry's
// content never changes once written.
func KeyEntry(c *x509.Certificate) string {
	return "key-" + Fingerprint(c)[:keyEntryHexLen] + ".pem"
}

// encodeKey adds key, cert's private key, to keys under its entry name,
// which it returns; "" for no key.
func encodeKey(keys map[string][]byte, key crypto.Signer, cert *x509.Certificate) (string, error) {
	if key == nil {
		return "", nil
	}
	if !csr.SamePublicKey(key.Public(), cert.PublicKey) {
		return "", fmt.Errorf("does not match the certificate %q", cert.Subject)
	}
	pem, err := pemutil.EncodePrivateKey(key)
	if err != nil {
		return "", err
	}
	name := KeyEntry(cert)
	keys[name] = pem
	return name, nil
}

// StateKeyEntries lists the key entries a state.json document refers to,
// so that a store can fetch exactly those.
func StateKeyEntries(data []byte) ([]string, error) {
	doc, err := parseStateDoc(data, true)
	if err != nil {
		return nil, &EntryError{Entry: EntryState, Err: err}
	}
	var names []string
	for i, ad := range doc.Authorities {
		for _, name := range []string{ad.Key, ad.RootKey} {
			switch {
			case name == "" || slices.Contains(names, name):
			case !IsKeyEntry(name):
				return nil, &EntryError{Entry: EntryState, Err: fmt.Errorf("authority %d (%.16s): %q is not a key entry name", i+1, ad.ID, name)}
			default:
				names = append(names, name)
			}
		}
	}
	return names, nil
}

// keyEntries decodes the key entries of a CA state, each once: the
// authorities under one root share the entry of its key.
type keyEntries struct {
	entries map[string][]byte
	used    map[string]usedKey
}

// usedKey is a key entry decoded, and whose certificate it is.
type usedKey struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// decode returns the key in entry name, cert's; nil for no name.
func (k keyEntries) decode(name string, cert *x509.Certificate) (crypto.Signer, error) {
	if name == "" {
		return nil, nil
	}
	if u, used := k.used[name]; used {
		if !u.cert.Equal(cert) {
			return nil, errors.New("is already taken by another certificate's key")
		}
		return u.key, nil
	}
	key, err := decodeKey(k.entries, name, cert)
	if err != nil {
		return nil, err
	}
	k.used[name] = usedKey{cert: cert, key: key}
	return key, nil
}

// entryError is err, on entry name of authority i.
func (k keyEntries) entryError(name string, i int, id string, err error) error {
	return &EntryError{Entry: name, Err: fmt.Errorf("authority %d (%.16s): %w", i+1, id, err)}
}

func decodeKey(entries map[string][]byte, name string, cert *x509.Certificate) (crypto.Signer, error) {
	data, ok := entries[name]
	if !ok {
		return nil, errors.New("missing: the state refers to this key, and an authority is never dropped for want of its key")
	}
	key, err := pemutil.ParsePrivateKey(data)
	if err != nil {
		return nil, err
	}
	if !csr.SamePublicKey(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("does not match the public key of the signing certificate %q", cert.Subject)
	}
	return key, nil
}

// IsKeyEntry reports whether name is the name KeyEntry gives a key, so
// that a store can tell a key it holds from anything else.
func IsKeyEntry(name string) bool {
	hex, ok := strings.CutPrefix(name, "key-")
	if !ok {
		return false
	}
	hex, ok = strings.CutSuffix(hex, ".pem")
	if !ok || len(hex) != keyEntryHexLen {
		return false
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
