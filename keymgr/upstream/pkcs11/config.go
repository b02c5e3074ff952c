// Package pkcs11 is the upstream whose root key lives in a PKCS#11 token
// (an HSM, or SoftHSM2 in tests) and never leaves it: the key is
// generated in the token, sensitive and not extractable, found by the
// label and ID its Ref names, and used as a crypto.Signer; meshca builds
// the root and each intermediate certificate and the token signs them.
//
// PKCS#11 means cgo and the vendor's C module, loaded with dlopen at run
// time: the working upstream is built only with the build tag pkcs11
// (make build-hsm, the meshca-hsm image). Without it, New says so, and
// the default meshca stays static and cgo-free.
package pkcs11

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Name is the upstream's name: --upstream's value and Ref.Type.
const Name = "pkcs11"

// DefaultKeyLabel labels a root key made for a root without a common
// name, with the time; NewRoot labels the others with the root's common
// name.
const DefaultKeyLabel = "meshca root"

// NotBuilt is what a meshca built without the tag pkcs11 answers.
const NotBuilt = "this meshca was built without PKCS#11 support; use the meshca-hsm build or image"

// Config selects the token and how to log in to it.
type Config struct {
	// Module is the path of the vendor's PKCS#11 module, a shared library
	// (SoftHSM2: /usr/lib/softhsm/libsofthsm2.so).
	Module string
	// TokenLabel selects the token by its label; Slot by its slot ID.
	// Exactly one is set.
	TokenLabel string
	Slot       *int
	// PIN is the user PIN. It is kept in memory to log in again after
	// the token drops the login, and never logged.
	PIN string
	// MaxSessions bounds the sessions meshca opens on the token, which
	// other applications may share: 0 means 4, enough for a renewal, a
	// root prepare and a status at once.
	MaxSessions int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// validate checks c without I/O.
func (c *Config) validate() error {
	switch {
	case c.Module == "":
		return errors.New("pkcs11: the module's path is required")
	case c.TokenLabel == "" && c.Slot == nil:
		return errors.New("pkcs11: a token label or a slot is required")
	case c.TokenLabel != "" && c.Slot != nil:
		return errors.New("pkcs11: give a token label or a slot, not both")
	case c.Slot != nil && *c.Slot < 0:
		return fmt.Errorf("pkcs11: slot %d is negative", *c.Slot)
	case c.PIN == "":
		return errors.New("pkcs11: the user PIN is required")
	case c.MaxSessions == 1 || c.MaxSessions < 0:
		return fmt.Errorf("pkcs11: at least 2 sessions are needed, not %d", c.MaxSessions)
	}
	return nil
}

// A keyRef is a key pair in the token: its CKA_LABEL and CKA_ID.
type keyRef struct {
	Label string
	ID    []byte
}

// String is the key's Ref.Key: an RFC 7512 PKCS#11 URI naming the object
// by label and ID, "pkcs11:object=meshca%20root%202026-12-06T19%3A42%3A00Z;id=%3a%7f...",
// as pkcs11-tool and p11tool name it (without the token, which the
// configuration selects).
func (k keyRef) String() string {
	var id strings.Builder
	for _, b := range k.ID {
		fmt.Fprintf(&id, "%%%02x", b)
	}
	return "pkcs11:object=" + escape(k.Label) + ";id=" + id.String()
}

// escape percent-encodes every byte of s but RFC 3986's unreserved ones.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// parseKeyRef reads a Ref.Key written by keyRef.String: exactly the
// attributes object and id, both present and not empty.
func parseKeyRef(s string) (keyRef, error) {
	rest, ok := strings.CutPrefix(s, "pkcs11:")
	if !ok {
		return keyRef{}, fmt.Errorf("pkcs11: key reference %q is not a pkcs11: URI", s)
	}
	var k keyRef
	seen := map[string]bool{}
	for _, attr := range strings.Split(rest, ";") {
		name, value, _ := strings.Cut(attr, "=")
		v, err := url.PathUnescape(value)
		switch {
		case err != nil:
			return keyRef{}, fmt.Errorf("pkcs11: key reference %q: %s: %w", s, name, err)
		case seen[name]:
			return keyRef{}, fmt.Errorf("pkcs11: key reference %q names %s twice", s, name)
		case name == "object":
			k.Label = v
		case name == "id":
			k.ID = []byte(v)
		default:
			return keyRef{}, fmt.Errorf("pkcs11: key reference %q: unknown attribute %q (want object and id)", s, name)
		}
		seen[name] = true
	}
	if k.Label == "" || len(k.ID) == 0 {
		return keyRef{}, fmt.Errorf("pkcs11: key reference %q lacks the object's label or ID", s)
	}
	return k, nil
}
