package vaulttransit

import (
	"context"
	"crypto"
	"crypto/rsa"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/meshca/meshca/keymgr/upstream"
)

// keySigner is one version of a Transit key as a crypto.Signer: Sign
// sends the digest to <mount>/sign/<name> (prehashed) and returns the
// signature, ASN.1 for ECDSA, PKCS #1 v1.5 or PSS for RSA as opts ask,
// which is what crypto/x509 asks of a signer. It is bound to the context
// of the renewal it serves.
type keySigner struct {
	ctx     context.Context
	u       *Upstream
	key     keyRef
	keyType string
	pub     crypto.PublicKey
}

func (k *keySigner) Public() crypto.PublicKey { return k.pub }

// Sign implements crypto.Signer. Its failures are *upstream.Error.
func (k *keySigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	hash, ok := hashNames[opts.HashFunc()]
	if !ok {
		return nil, errorf(upstream.KindInternal, "Transit signs no %v digest", opts.HashFunc())
	}
	p := map[string]any{
		"input":          base64.StdEncoding.EncodeToString(digest),
		"prehashed":      true,
		"hash_algorithm": hash,
		"key_version":    k.key.version,
	}
	switch {
	case strings.HasPrefix(k.keyType, "ecdsa-"):
		p["marshaling_algorithm"] = "asn1"
	case strings.HasPrefix(k.keyType, "rsa-"):
		p["signature_algorithm"] = "pkcs1v15"
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			p["signature_algorithm"], p["salt_length"] = "pss", saltLength(pss)
		}
	}
	path := k.u.c.Mount + "/sign/" + k.key.name
	secret, err := k.u.sess.Write(k.ctx, path, p)
	if err != nil {
		return nil, upstreamError(err)
	}
	sig, _ := secret.Data["signature"].(string)
	// "vault:v<version>:<base64>"
	want := "vault:v" + strconv.Itoa(k.key.version) + ":"
	enc, ok := strings.CutPrefix(sig, want)
	if !ok {
		return nil, errorf(upstream.KindInternal, "%s answered a signature not of version %d", path, k.key.version)
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: the signature: %v", path, err)
	}
	return raw, nil
}

// hashNames are Transit's names of the digests crypto/x509 signs.
var hashNames = map[crypto.Hash]string{
	crypto.SHA256: "sha2-256",
	crypto.SHA384: "sha2-384",
	crypto.SHA512: "sha2-512",
}

// saltLength is Transit's salt_length for o.
func saltLength(o *rsa.PSSOptions) string {
	switch o.SaltLength {
	case rsa.PSSSaltLengthEqualsHash:
		return "hash"
	case rsa.PSSSaltLengthAuto:
		return "auto"
	}
	return strconv.Itoa(o.SaltLength)
}

// keyRef is a Transit key's version, as upstream.Ref.Key writes it:
// "<name>:<version>". Transit's key names hold no colon.
type keyRef struct {
	name    string
	version int
}

func (r keyRef) String() string { return r.name + ":" + strconv.Itoa(r.version) }

func parseKeyRef(s string) (keyRef, error) {
	name, v, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(v)
	if !ok || err != nil || n < 1 || name == "" || strings.ContainsAny(name, "/?#:") {
		return keyRef{}, fmt.Errorf("%q is not a Transit key's <name>:<version>", s)
	}
	return keyRef{name: name, version: n}, nil
}
