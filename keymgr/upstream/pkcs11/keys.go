//go:build pkcs11

package pkcs11

import (
	"crypto"
	"crypto/elliptic"
	"fmt"

	"github.com/ThalesGroup/crypto11"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/miekg/pkcs11"
)

// custody are the private key attributes a root key must have, whether
// NewRoot made it or an operator did: kept in the token, readable only
// after login, its value never revealed nor extractable, used only to
// sign. The token itself adds CKA_ALWAYS_SENSITIVE, CKA_NEVER_EXTRACTABLE
// and CKA_LOCAL to a key it generated.
func custody() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
		pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, false),
		pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, false),
		pkcs11.NewAttribute(pkcs11.CKA_DERIVE, false),
	}
}

// publicHalf are the public key's attributes: in the token beside the
// private key, for verifying only.
func publicHalf() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
		pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, false),
		pkcs11.NewAttribute(pkcs11.CKA_WRAP, false),
		pkcs11.NewAttribute(pkcs11.CKA_DERIVE, false),
	}
}

// generate makes a key pair of type kt in the token, labelled and
// identified as k says, with the custody attributes.
func generate(c *crypto11.Context, kt certs.KeyType, k keyRef) (crypto11.Signer, error) {
	pub, err := crypto11.NewAttributeSetWithIDAndLabel(k.ID, []byte(k.Label))
	if err != nil {
		return nil, err
	}
	priv := pub.Copy()
	pub.AddIfNotPresent(publicHalf())
	priv.AddIfNotPresent(custody())
	switch kt {
	case certs.KeyECP256, "":
		return c.GenerateECDSAKeyPairWithAttributes(pub, priv, elliptic.P256())
	case certs.KeyECP384:
		return c.GenerateECDSAKeyPairWithAttributes(pub, priv, elliptic.P384())
	case certs.KeyRSA2048:
		return c.GenerateRSAKeyPairWithAttributes(pub, priv, 2048)
	case certs.KeyRSA3072:
		return c.GenerateRSAKeyPairWithAttributes(pub, priv, 3072)
	case certs.KeyRSA4096:
		return c.GenerateRSAKeyPairWithAttributes(pub, priv, 4096)
	}
	return nil, &keyError{fmt.Sprintf("unknown key type %q (want one of %v)", kt, certs.KeyTypes)}
}

// find returns the one key pair k names, refusing a key whose value could
// leave the token (not sensitive, or extractable) and, when want is not
// nil, a key whose public half is not want: the root's key, as the CA
// state records the root.
func find(c *crypto11.Context, k keyRef, want crypto.PublicKey) (crypto11.Signer, error) {
	found, err := c.FindKeyPairs(k.ID, []byte(k.Label))
	switch {
	case err != nil:
		return nil, err
	case len(found) == 0:
		return nil, errKeyNotFound
	case len(found) > 1:
		return nil, &keyError{fmt.Sprintf("%d key pairs have the label and ID of %s: a root key must be one", len(found), k)}
	}
	key := found[0]
	attrs, err := c.GetAttributes(key, []crypto11.AttributeType{crypto11.CkaSensitive, crypto11.CkaExtractable})
	if err != nil {
		return nil, err
	}
	if !isTrue(attrs[crypto11.CkaSensitive]) || isTrue(attrs[crypto11.CkaExtractable]) {
		return nil, &keyError{fmt.Sprintf("the private key %s can leave the token (CKA_SENSITIVE %v, CKA_EXTRACTABLE %v): a root key must be sensitive and not extractable",
			k, isTrue(attrs[crypto11.CkaSensitive]), isTrue(attrs[crypto11.CkaExtractable]))}
	}
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if want != nil {
		if pub, ok := key.Public().(equaler); !ok || !pub.Equal(want) {
			return nil, &keyError{fmt.Sprintf("the key %s in the token is not the root's key", k)}
		}
	}
	return key, nil
}

// isTrue reads a CK_BBOOL attribute; a missing one is false.
func isTrue(a *crypto11.Attribute) bool {
	return a != nil && len(a.Value) == 1 && a.Value[0] != 0
}
