package e2e

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
)

// csrAttacks: CSRs that ask for more than exactly the caller's identity
// with workload usages, or that cannot be trusted to. README:
// InvalidArgument, with "invalid CSR: <what is wrong>"; a request over
// the 64 KiB message limit is ResourceExhausted from gRPC.
func (a *arena) csrAttacks(t *testing.T) []attack {
	id := a.webID
	uri := func(s string) asn1.RawValue { return generalName(6, []byte(s)) }
	p256 := func() crypto.Signer { return ecKey(t, elliptic.P256()) }
	with := func(exts ...pkix.Extension) string {
		return build(t, p256(), &x509.CertificateRequest{ExtraExtensions: exts})
	}
	own := sanExt(uri(id.String()))
	good := newCSR(t, id)
	block, _ := pem.Decode([]byte(good))
	start := time.Now()
	bigRSA := <-a.bigRSA
	t.Logf("waited %v for the RSA-16384 and RSA-40960 keys", time.Since(start).Round(time.Millisecond))
	big16kCSR := build(t, bigRSA[0], &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{own}})
	a.rsa16kBadSig = flipSignature(big16kCSR)
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	inv := func(name, csrPEM, msg, reason string) attack {
		return attack{name: "csr/" + name, do: a.asWeb(csrPEM), code: codes.InvalidArgument, msg: msg, reason: "csr_" + reason}
	}
	return []attack{
		inv("bad signature", flipSignature(good), "invalid CSR: CSR signature does not verify", "bad_signature"),
		inv("two CSRs in one PEM", good+newCSR(t, id), "data after the CSR: send exactly one PEM block", "malformed"),
		inv("trailing garbage", good+"garbage", "data after the CSR", "malformed"),
		inv("leading garbage", "garbage\n"+good, "data before the CSR", "malformed"),
		// DER bytes themselves are not a proto3 string (invalid UTF-8):
		// see fixedBugs. Base64 without the PEM armour is.
		inv("DER, base64 without PEM armour", base64.StdEncoding.EncodeToString(block.Bytes), "no PEM block found", "malformed"),
		inv("empty", "", "no PEM block found", "malformed"),
		inv("PEM of a certificate", strings.ReplaceAll(good, "CERTIFICATE REQUEST", "CERTIFICATE"), `PEM block is "CERTIFICATE"`, "malformed"),
		inv("PEM headers", pemCSR(block.Bytes, map[string]string{"Proc-Type": "4,ENCRYPTED"}), "PEM block has headers", "malformed"),
		inv("PEM around garbage", pemCSR([]byte("not DER at all"), nil), "cannot parse PKCS#10", "malformed"),
		inv("extra DNS SAN", with(sanExt(uri(id.String()), generalName(2, []byte("evil.example.com")))), "subjectAltName holds 2 names", "extra_name"),
		inv("extra IP SAN", with(sanExt(uri(id.String()), generalName(7, []byte{10, 0, 0, 1}))), "subjectAltName holds 2 names", "extra_name"),
		inv("extra email SAN", with(sanExt(uri(id.String()), generalName(1, []byte("root@evil.example")))), "subjectAltName holds 2 names", "extra_name"),
		inv("second URI SAN", with(sanExt(uri(id.String()), uri(a.id("admin").String()))), "subjectAltName holds 2 names", "extra_name"),
		inv("DNS SAN only", with(sanExt(generalName(2, []byte("evil.example.com")))), "subjectAltName holds a DNS name", "extra_name"),
		inv("IP SAN only", with(sanExt(generalName(7, []byte{10, 0, 0, 1}))), "IP address", "extra_name"),
		inv("email SAN only", with(sanExt(generalName(1, []byte("root@evil.example")))), "email address", "extra_name"),
		inv("another identity's URI", with(sanExt(uri(a.id("admin").String()))), "may only receive "+id.String(), "identity_mismatch"),
		inv("no SAN", with(), "CSR has no subjectAltName", "identity_mismatch"),
		inv("two SAN extensions", with(own, own), "duplicate requested extensions", "malformed"),
		inv("CN differing from the ID", build(t, p256(), &x509.CertificateRequest{Subject: pkix.Name{CommonName: a.id("admin").String()},
			ExtraExtensions: []pkix.Extension{own}}), "subject common name", "extra_name"),
		inv("CA:true", with(own, basicConstraints(t, true, -1)), "CA certificate", "ca_requested"),
		inv("CA:true with pathLen", with(own, basicConstraints(t, true, 3)), "CA certificate", "ca_requested"),
		inv("CA:false with pathLen", with(own, basicConstraints(t, false, 0)), "extension basicConstraints is not allowed", "extension"),
		inv("keyUsage certSign", with(own, keyUsage(t, x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign)), "cert sign", "usage_not_allowed"),
		inv("keyUsage crlSign", with(own, keyUsage(t, x509.KeyUsageDigitalSignature|x509.KeyUsageCRLSign)), "crl sign", "usage_not_allowed"),
		inv("keyUsage keyEncipherment on an EC key", with(own, keyUsage(t, x509.KeyUsageKeyEncipherment)), "key encipherment", "usage_not_allowed"),
		inv("extKeyUsage codeSigning", with(own, extKeyUsage(t, 1, 3, 6, 1, 5, 5, 7, 3, 3)), "code signing", "usage_not_allowed"),
		inv("extKeyUsage any", with(own, extKeyUsage(t, 2, 5, 29, 37, 0)), `"any"`, "usage_not_allowed"),
		inv("extKeyUsage of an unknown OID", with(own, extKeyUsage(t, 1, 3, 6, 1, 4, 1, 99999, 1)), "extended key usage 1.3.6.1.4.1.99999.1 is not allowed",
			"usage_not_allowed"),
		inv("unknown critical extension", with(own, pkix.Extension{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 2}, Critical: true, Value: []byte{5, 0}}),
			"extension 1.3.6.1.4.1.99999.2 is not allowed", "extension"),
		inv("nameConstraints", with(own, pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 30}, Critical: true, Value: []byte{0x30, 0}}),
			"extension 2.5.29.30 is not allowed", "extension"),
		inv("RSA-1024", build(t, rsa1024, &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{own}}), "RSA key of 1024 bits is not allowed", "key_policy"),
		// The server's latency for it is in the log (audit latency); see
		// fixedBugs for the order of the checks.
		inv("RSA-16384", big16kCSR, "RSA key of 16384 bits is not allowed", "key_policy"),
		// About the largest key whose CSR fits 16 KiB of PEM.
		inv("RSA-40960", build(t, bigRSA[1], &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{own}}),
			"RSA key of 40960 bits is not allowed", "key_policy"),
		inv("ECDSA P-224", build(t, ecKey(t, elliptic.P224()), &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{own}}),
			"ECDSA curve P-224 is not allowed", "key_policy"),
		inv("ECDSA P-521 (not in the default policy)", build(t, ecKey(t, elliptic.P521()), &x509.CertificateRequest{ExtraExtensions: []pkix.Extension{own}}),
			"ECDSA curve P-521 is not allowed", "key_policy"),
		// Go's x509 parses an Ed448 key as an unknown algorithm (a nil
		// key): the key policy refuses it before any signature check.
		inv("Ed448", ed448CSR(t, with(own)), "the key's algorithm is not supported", "key_policy"),
		inv("huge CSR (24 KiB, under the message limit)", with(own, pkix.Extension{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 3},
			Value: make([]byte, 18<<10)}), "the limit is 16384", "too_large"),
		{name: "csr/over the 64 KiB message limit", do: a.asWeb(strings.Repeat("A", 70<<10)), transport: true, code: codes.ResourceExhausted,
			msg: "larger than max"},
	}
}

// ttlAttacks: lifetimes meshca must refuse. README and Istio: a TTL above
// --max-ttl is InvalidArgument (not clamped); values whose nanoseconds
// overflow an int64 are above it too and must not wrap round to a short
// or negative lifetime. A TTL <= 0 asks for the default (wire contract):
// see accepted.
func (a *arena) ttlAttacks(t *testing.T) []attack {
	ttl := func(name string, seconds int64) attack {
		return attack{name: "ttl/" + name, code: codes.InvalidArgument, msg: "is above the maximum 7776000s", reason: "ttl_too_long",
			do: a.do(probe{token: a.web.Token, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID), ValidityDuration: seconds}})}
	}
	return []attack{
		ttl("one second above --max-ttl", 90*24*3600+1),
		ttl("int64 maximum", math.MaxInt64),
		ttl("nanoseconds overflow int64", math.MaxInt64/int64(time.Second)+1),
		// 18446744074e9 ns is 2^64 + 0.29e9: wrapped, a 0.29 s lifetime.
		ttl("nanoseconds wrap round to a short TTL", 18446744074),
	}
}

func ecKey(t *testing.T, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// flipSignature corrupts the last bytes of a PEM CSR's signature.
func flipSignature(csrPEM string) string {
	block, _ := pem.Decode([]byte(csrPEM))
	der := append([]byte(nil), block.Bytes...)
	der[len(der)-3] ^= 0xff
	return pemCSR(der, nil)
}

func pemCSR(der []byte, headers map[string]string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Headers: headers, Bytes: der}))
}

// generalName is a GeneralName of the given context tag (RFC 5280,
// 4.2.1.6): 1 email, 2 DNS, 6 URI, 7 IP.
func generalName(tag int, b []byte) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: tag, Bytes: b}
}

// sanExt is a critical subjectAltName holding names in order.
func sanExt(names ...asn1.RawValue) pkix.Extension {
	v, err := asn1.Marshal(names)
	if err != nil {
		panic(err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: true, Value: v}
}

func basicConstraints(t *testing.T, ca bool, pathLen int) pkix.Extension {
	t.Helper()
	v, err := asn1.Marshal(struct {
		IsCA       bool `asn1:"optional"`
		MaxPathLen int  `asn1:"optional,default:-1"`
	}{ca, pathLen})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: v}
}

func keyUsage(t *testing.T, ku x509.KeyUsage) pkix.Extension {
	t.Helper()
	var b [2]byte
	n := 0
	for i := range 9 {
		if ku&(1<<i) != 0 {
			b[i/8] |= 0x80 >> (i % 8)
			n = i + 1
		}
	}
	v, err := asn1.Marshal(asn1.BitString{Bytes: b[:(n+7)/8], BitLength: n})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 15}, Critical: true, Value: v}
}

func extKeyUsage(t *testing.T, oid ...int) pkix.Extension {
	t.Helper()
	v, err := asn1.Marshal([]asn1.ObjectIdentifier{{1, 3, 6, 1, 5, 5, 7, 3, 1}, oid})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 37}, Value: v}
}

// ed448CSR rewrites a CSR to carry an Ed448 key (OID 1.3.101.113) and an
// Ed448-sized signature, which Go cannot make.
func ed448CSR(t *testing.T, from string) string {
	t.Helper()
	type info struct {
		Version       int
		Subject       asn1.RawValue
		PublicKey     asn1.RawValue
		RawAttributes []asn1.RawValue `asn1:"tag:0"`
	}
	var req struct {
		Info   info
		SigAlg pkix.AlgorithmIdentifier
		Sig    asn1.BitString
	}
	block, _ := pem.Decode([]byte(from))
	if _, err := asn1.Unmarshal(block.Bytes, &req); err != nil {
		t.Fatal(err)
	}
	ed448 := pkix.AlgorithmIdentifier{Algorithm: asn1.ObjectIdentifier{1, 3, 101, 113}}
	pub, sig := make([]byte, 57), make([]byte, 114)
	_, _ = rand.Read(pub)
	_, _ = rand.Read(sig)
	spki, err := asn1.Marshal(struct {
		Alg pkix.AlgorithmIdentifier
		Key asn1.BitString
	}{ed448, asn1.BitString{Bytes: pub, BitLength: 8 * len(pub)}})
	if err != nil {
		t.Fatal(err)
	}
	req.Info.PublicKey = asn1.RawValue{FullBytes: spki}
	req.SigAlg, req.Sig = ed448, asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}
	der, err := asn1.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return pemCSR(der, nil)
}

// multiPrimeRSA is an RSA key of many 256-bit primes: its public key is
// an ordinary RSA key of the full size (nothing in it tells how many
// primes it has), but it is made in a fraction of a second where two
// 8192-bit primes take minutes, and it signs (PKCS #1 v1.5, SHA-256) by
// the Chinese remainder theorem over its primes.
type multiPrimeRSA struct {
	pub    *rsa.PublicKey
	primes []*big.Int
}

// bigRSAKeys makes an RSA-16384 and an RSA-40960 key in the background.
func bigRSAKeys() chan [2]*multiPrimeRSA {
	c := make(chan [2]*multiPrimeRSA, 1)
	go func() { c <- [2]*multiPrimeRSA{newMultiPrimeRSA(16384), newMultiPrimeRSA(40960)} }()
	return c
}

func newMultiPrimeRSA(bits int) *multiPrimeRSA {
	e := big.NewInt(65537)
	prime := func(size int) *big.Int {
		for {
			p, err := rand.Prime(rand.Reader, size)
			if err != nil {
				panic(err) // crypto/rand does not fail
			}
			if new(big.Int).GCD(nil, nil, new(big.Int).Sub(p, big.NewInt(1)), e).Cmp(big.NewInt(1)) == 0 {
				return p
			}
		}
	}
	for {
		k := &multiPrimeRSA{pub: &rsa.PublicKey{N: big.NewInt(1), E: 65537}}
		for range bits/256 - 1 {
			p := prime(256)
			k.primes = append(k.primes, p)
			k.pub.N.Mul(k.pub.N, p)
		}
		rest := bits - k.pub.N.BitLen()
		for range 32 {
			p := prime(rest)
			if n := new(big.Int).Mul(k.pub.N, p); n.BitLen() == bits {
				k.primes, k.pub.N = append(k.primes, p), n
				return k
			}
		}
	}
}

func (k *multiPrimeRSA) Public() crypto.PublicKey { return k.pub }

// sha256Prefix is the DER DigestInfo prefix of a SHA-256 digest.
var sha256Prefix = []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}

func (k *multiPrimeRSA) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts.HashFunc() != crypto.SHA256 {
		return nil, errors.New("multiPrimeRSA signs SHA-256 digests only")
	}
	size := (k.pub.N.BitLen() + 7) / 8
	em := make([]byte, size)
	em[1] = 1
	tail := append(append([]byte(nil), sha256Prefix...), digest...)
	for i := 2; i < size-len(tail)-1; i++ {
		em[i] = 0xff
	}
	copy(em[size-len(tail):], tail)
	m, s := new(big.Int).SetBytes(em), new(big.Int)
	e := big.NewInt(int64(k.pub.E))
	for _, p := range k.primes {
		d := new(big.Int).ModInverse(e, new(big.Int).Sub(p, big.NewInt(1)))
		sp := new(big.Int).Exp(new(big.Int).Mod(m, p), d, p)
		rest := new(big.Int).Div(k.pub.N, p)
		coef := new(big.Int).ModInverse(new(big.Int).Mod(rest, p), p)
		s.Add(s, sp.Mul(sp, rest).Mul(sp, coef))
	}
	return s.Mod(s, k.pub.N).FillBytes(make([]byte, size)), nil
}
