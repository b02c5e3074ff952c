package cfssl

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/cloudflare/cfssl/config"
	cfsigner "github.com/cloudflare/cfssl/signer"
	cflocal "github.com/cloudflare/cfssl/signer/local"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer"
)

var (
	oidKeyUsage    = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage = asn1.ObjectIdentifier{2, 5, 29, 37}
)

// LocalConfig configures in-process signing.
type LocalConfig struct {
	CACert *x509.Certificate
	CAKey  crypto.Signer
	// Chain holds the certificates above CACert up to (not including) the
	// root, sent with every leaf.
	Chain []*x509.Certificate
	// Policy is a cfssl signing configuration; DefaultPolicy when nil. A
	// profile's usages (in the cfssl vocabulary) bound what meshca may ask
	// for; the certificate carries exactly the usages meshca derives from
	// the key. Whatever a profile's CSR whitelist says, only the key is
	// taken from a CSR: never its subject, names or extensions.
	Policy  *config.Signing
	Profile string
	// DNSProfile names the profile of Policy that signs DNS requests
	// (istiod's serving certificate); "default" names Policy's default.
	// Empty: DNS requests are refused.
	DNSProfile string
	// Backdate is how far before now leaves start, as in
	// certs.WindowOptions: zero means certs.Backdate.
	Backdate time.Duration
	Now      func() time.Time
}

// DefaultIstiodProfile is the profile of DefaultPolicy set aside for DNS
// requests (istiod's serving certificate).
const DefaultIstiodProfile = "istiod"

// DefaultPolicy allows workloads digital signature, key encipherment (only
// RSA keys get it), server auth and client auth, for at most 90 days; its
// profile DefaultIstiodProfile allows the same to istiod's DNS
// certificate.
func DefaultPolicy() *config.Signing {
	allowed := csr.Usages{
		Key: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		Ext: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	p := &config.SigningProfile{
		Usage:        allowed.Strings(),
		Expiry:       90 * 24 * time.Hour,
		ExpiryString: "2160h",
	}
	istiod := *p
	return &config.Signing{Default: p, Profiles: map[string]*config.SigningProfile{DefaultIstiodProfile: &istiod}}
}

// NewLocal returns an in-process cfssl signer.
func NewLocal(c LocalConfig) (*Signer, error) {
	quiet()
	if c.CACert == nil || c.CAKey == nil {
		return nil, errors.New("cfssl: CA certificate and key are required")
	}
	if c.Policy == nil {
		c.Policy = DefaultPolicy()
	}
	if !c.Policy.Valid() {
		return nil, errors.New("cfssl: invalid signing policy")
	}
	if _, ok := c.Policy.Profiles[c.DNSProfile]; c.DNSProfile != "" && !ok {
		return nil, fmt.Errorf("cfssl: the signing policy has no profile %q for DNS certificates", c.DNSProfile)
	}
	b := &localBackend{cert: c.CACert, allowed: map[*config.SigningProfile]csr.Usages{}}
	policy := &config.Signing{Profiles: map[string]*config.SigningProfile{}}
	var err error
	if policy.Default, err = b.harden("default", c.Policy.Default); err != nil {
		return nil, err
	}
	for n, p := range c.Policy.Profiles {
		if policy.Profiles[n], err = b.harden(n, p); err != nil {
			return nil, err
		}
	}
	if b.signer, err = cflocal.NewSigner(c.CAKey, c.CACert, cfsigner.DefaultSigAlgo(c.CAKey), policy); err != nil {
		return nil, fmt.Errorf("cfssl: %w", err)
	}
	chain := c.Chain
	if !certs.IsSelfSigned(c.CACert) {
		chain = append([]*x509.Certificate{c.CACert}, c.Chain...)
	}
	return &Signer{backend: b, chain: chain, profile: c.Profile, dnsProfile: c.DNSProfile, backdate: c.Backdate, now: nowOr(c.Now)}, nil
}

// localBackend signs with cfssl's own signer in process.
type localBackend struct {
	signer *cflocal.Signer
	cert   *x509.Certificate
	// allowed holds the usages each (hardened) profile grants.
	allowed map[*config.SigningProfile]csr.Usages
}

// harden returns a copy of profile p that takes only the key from a CSR
// and lets meshca's keyUsage and extKeyUsage extensions through, and
// records the usages p allows.
func (b *localBackend) harden(n string, p *config.SigningProfile) (*config.SigningProfile, error) {
	allowed, err := csr.ParseUsages(p.Usage)
	if err != nil {
		return nil, fmt.Errorf("cfssl: profile %q: %w", n, err)
	}
	h := *p
	h.CSRWhitelist = &config.CSRWhitelist{PublicKey: true, PublicKeyAlgorithm: true, SignatureAlgorithm: true}
	h.ExtensionWhitelist = maps.Clone(p.ExtensionWhitelist)
	if h.ExtensionWhitelist == nil {
		h.ExtensionWhitelist = map[string]bool{}
	}
	h.ExtensionWhitelist[oidKeyUsage.String()] = true
	h.ExtensionWhitelist[oidExtKeyUsage.String()] = true
	b.allowed[&h] = allowed
	return &h, nil
}

func (b *localBackend) issuer(context.Context) (*x509.Certificate, error) { return b.cert, nil }

func (b *localBackend) reissuer(context.Context, *x509.Certificate) (*x509.Certificate, error) {
	return b.cert, nil
}

func (b *localBackend) sign(_ context.Context, req cfsigner.SignRequest, usages csr.Usages) ([]byte, error) {
	p, err := cfsigner.Profile(b.signer, req.Profile)
	if err != nil {
		return nil, signer.Errorf(name, signer.KindRefused, "cfssl refused: %w", err)
	}
	if extra, ok := usages.Subset(b.allowed[p]); !ok {
		return nil, signer.Errorf(name, signer.KindRefused, "cfssl profile %q does not allow the usages %q workloads need: add them to its usages", profileName(req.Profile), extra)
	}
	if req.Extensions, err = usageExtensions(usages); err != nil {
		return nil, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: err}
	}
	out, err := b.signer.Sign(req)
	if err != nil {
		return nil, signer.Errorf(name, signer.KindRefused, "cfssl refused: %w", err)
	}
	return out, nil
}

func profileName(p string) string {
	if p == "" {
		return "default"
	}
	return p
}

// usageExtensions encodes u as the keyUsage (critical, as crypto/x509
// marks it) and extKeyUsage extensions of a SignRequest, which take the
// place of the profile's usages in the certificate.
func usageExtensions(u csr.Usages) ([]cfsigner.Extension, error) {
	if u.Key == 0 || len(u.Ext) == 0 {
		return nil, errors.New("the request carries no usages")
	}
	ku, err := asn1.Marshal(keyUsageBits(u.Key))
	if err != nil {
		return nil, fmt.Errorf("encode key usage: %w", err)
	}
	oids := make([]asn1.ObjectIdentifier, len(u.Ext))
	for i, e := range u.Ext {
		oid, ok := csr.ExtKeyUsageOID(e)
		if !ok {
			return nil, fmt.Errorf("extended key usage %v has no OID", e)
		}
		oids[i] = oid
	}
	eku, err := asn1.Marshal(oids)
	if err != nil {
		return nil, fmt.Errorf("encode extended key usage: %w", err)
	}
	return []cfsigner.Extension{
		{ID: config.OID(oidKeyUsage), Critical: true, Value: hex.EncodeToString(ku)},
		{ID: config.OID(oidExtKeyUsage), Value: hex.EncodeToString(eku)},
	}, nil
}

// keyUsageBits is ku as the DER named bit list of RFC 5280, 4.2.1.3: bit
// i of x509.KeyUsage is ASN.1 bit i, trailing zero bits left out.
func keyUsageBits(ku x509.KeyUsage) asn1.BitString {
	var bs asn1.BitString
	for i := 0; i < 9; i++ {
		if ku&(1<<i) == 0 {
			continue
		}
		for len(bs.Bytes) <= i/8 {
			bs.Bytes = append(bs.Bytes, 0)
		}
		bs.Bytes[i/8] |= 0x80 >> (i % 8)
		bs.BitLength = i + 1
	}
	return bs
}
