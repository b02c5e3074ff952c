package csr_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/meshca/meshca/csr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The identity every test request is checked against, and another one.
var (
	testID  = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/httpbin")
	otherID = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/sleep")
)

// Extension OIDs used to build requests by hand.
var (
	oidSAN              = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidSubjectKeyID     = asn1.ObjectIdentifier{2, 5, 29, 14}

	oidEKUServerAuth  = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
	oidEKUClientAuth  = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}
	oidEKUCodeSigning = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 3}
	oidEKUAny         = asn1.ObjectIdentifier{2, 5, 29, 37, 0}
)

// Keys are generated once per test binary: RSA generation is slow, above
// all under the race detector.
var (
	p224Key    = sync.OnceValue(func() crypto.Signer { return mustECDSA(elliptic.P224()) })
	p256Key    = sync.OnceValue(func() crypto.Signer { return mustECDSA(elliptic.P256()) })
	p384Key    = sync.OnceValue(func() crypto.Signer { return mustECDSA(elliptic.P384()) })
	p521Key    = sync.OnceValue(func() crypto.Signer { return mustECDSA(elliptic.P521()) })
	ed25519Key = sync.OnceValue(func() crypto.Signer {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return k
	})
	rsa1024Key = sync.OnceValue(func() crypto.Signer { return mustRSA(1024) })
	rsa2048Key = sync.OnceValue(func() crypto.Signer { return mustRSA(2048) })
	// Generating an RSA-8192 key takes tens of seconds, so the test uses a
	// fixed one.
	rsa8192Key = sync.OnceValue(func() crypto.Signer { return mustParseTestingKey(rsa8192PEM) })
)

func mustECDSA(c elliptic.Curve) crypto.Signer {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

func mustRSA(bits int) crypto.Signer {
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		panic(err)
	}
	return k
}

// mustParseTestingKey reads a PKCS#8 key whose PEM type says TESTING KEY, so
// that secret scanners leave it alone.
func mustParseTestingKey(s string) crypto.Signer {
	block, _ := pem.Decode([]byte(strings.ReplaceAll(s, "TESTING KEY", "PRIVATE KEY")))
	if block == nil {
		panic("bad testing key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		panic(err)
	}
	return k.(crypto.Signer)
}

// ztunnelPEM returns the request ztunnel sends for id, signed by key.
func ztunnelPEM(tb testing.TB, key crypto.Signer, id spiffeid.ID) []byte {
	tb.Helper()
	data, err := csr.Build(key, id)
	if err != nil {
		tb.Fatalf("Build: %v", err)
	}
	return data
}

// createDER returns a request made from tmpl and signed by key.
func createDER(tb testing.TB, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	tb.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		tb.Fatalf("CreateCertificateRequest: %v", err)
	}
	return der
}

func pemCSR(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// mustParse parses a PEM request with csr.Parse and fails the test if it
// is refused.
func mustParse(tb testing.TB, data []byte) *x509.CertificateRequest {
	tb.Helper()
	req, err := csr.Parse(data)
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	return req
}

// requireReason fails the test unless err is a *csr.Error with the given
// reason whose detail contains fragment. An empty reason means err must be
// nil.
func requireReason(tb testing.TB, err error, reason csr.Reason, fragment string) {
	tb.Helper()
	if reason == "" {
		if err != nil {
			tb.Fatalf("got error %v, want none", err)
		}
		return
	}
	if err == nil {
		tb.Fatalf("got no error, want reason %q", reason)
	}
	var cerr *csr.Error
	if !errors.As(err, &cerr) {
		tb.Fatalf("error %v (%T) is not a *csr.Error", err, err)
	}
	if cerr.Reason != reason {
		tb.Fatalf("reason = %q, want %q (error: %v)", cerr.Reason, reason, err)
	}
	if !strings.Contains(cerr.Detail, fragment) {
		tb.Fatalf("detail %q does not contain %q", cerr.Detail, fragment)
	}
	if !strings.Contains(err.Error(), string(reason)) {
		tb.Fatalf("Error() = %q does not name the reason %q", err.Error(), reason)
	}
}

// sanExt returns a subjectAltName extension holding the given general
// names.
func sanExt(tb testing.TB, names ...asn1.RawValue) pkix.Extension {
	tb.Helper()
	if names == nil {
		names = []asn1.RawValue{}
	}
	der, err := asn1.Marshal(names)
	if err != nil {
		tb.Fatalf("marshal SAN: %v", err)
	}
	return pkix.Extension{Id: oidSAN, Critical: true, Value: der}
}

// uriName returns a uniformResourceIdentifier general name.
func uriName(s string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(s)}
}

// keyUsageExt returns a keyUsage extension with the bits of ku set, in DER
// (no trailing zero bits).
func keyUsageExt(tb testing.TB, ku x509.KeyUsage) pkix.Extension {
	tb.Helper()
	var bs asn1.BitString
	for i := 0; i < 16; i++ {
		if ku&(1<<uint(i)) != 0 {
			bs.BitLength = i + 1
		}
	}
	bs.Bytes = make([]byte, (bs.BitLength+7)/8)
	for i := 0; i < bs.BitLength; i++ {
		if ku&(1<<uint(i)) != 0 {
			bs.Bytes[i/8] |= 0x80 >> uint(i%8)
		}
	}
	der, err := asn1.Marshal(bs)
	if err != nil {
		tb.Fatalf("marshal keyUsage: %v", err)
	}
	return pkix.Extension{Id: oidKeyUsage, Critical: true, Value: der}
}

// extKeyUsageExt returns an extKeyUsage extension holding oids.
func extKeyUsageExt(tb testing.TB, oids ...asn1.ObjectIdentifier) pkix.Extension {
	tb.Helper()
	der, err := asn1.Marshal(oids)
	if err != nil {
		tb.Fatalf("marshal extKeyUsage: %v", err)
	}
	return pkix.Extension{Id: oidExtKeyUsage, Value: der}
}

// basicConstraintsExt returns a basicConstraints extension.
func basicConstraintsExt(tb testing.TB, isCA bool) pkix.Extension {
	tb.Helper()
	der, err := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{isCA})
	if err != nil {
		tb.Fatalf("marshal basicConstraints: %v", err)
	}
	return pkix.Extension{Id: oidBasicConstraints, Critical: true, Value: der}
}

// rawCSR is a PKCS#10 request with its parts kept as DER.
type rawCSR struct {
	Info struct {
		Raw        asn1.RawContent
		Version    int
		Subject    asn1.RawValue
		PublicKey  asn1.RawValue
		Attributes asn1.RawValue
	}
	SignatureAlgorithm pkix.AlgorithmIdentifier
	Signature          asn1.BitString
}

func splitCSR(tb testing.TB, der []byte) *rawCSR {
	tb.Helper()
	var r rawCSR
	// Unmarshal aliases its input: work on a copy so that callers may
	// change the parts.
	if rest, err := asn1.Unmarshal(bytes.Clone(der), &r); err != nil || len(rest) != 0 {
		tb.Fatalf("split CSR: %v (%d trailing bytes)", err, len(rest))
	}
	return &r
}

func (r *rawCSR) marshal(tb testing.TB) []byte {
	tb.Helper()
	der, err := asn1.Marshal(*r)
	if err != nil {
		tb.Fatalf("marshal CSR: %v", err)
	}
	return der
}

// withECDSAKey returns der, a request signed with ECDSA and SHA-256, with
// its public key replaced by the one of key and signed again by key. It
// makes requests x509.CreateCertificateRequest refuses to make, such as
// for P-224 keys.
func withECDSAKey(tb testing.TB, der []byte, key *ecdsa.PrivateKey) []byte {
	tb.Helper()
	r := splitCSR(tb, der)
	spki, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		tb.Fatalf("MarshalPKIXPublicKey: %v", err)
	}
	r.Info.Raw = nil
	r.Info.PublicKey = asn1.RawValue{FullBytes: spki}
	info, err := asn1.Marshal(r.Info)
	if err != nil {
		tb.Fatalf("marshal request info: %v", err)
	}
	digest := sha256.Sum256(info)
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		tb.Fatalf("SignASN1: %v", err)
	}
	r.Info.Raw = info
	r.Signature = asn1.BitString{Bytes: sig, BitLength: 8 * len(sig)}
	return r.marshal(tb)
}

// rsa8192PEM is a fixed RSA-8192 key for tests only.
const rsa8192PEM = `
-----BEGIN TESTING KEY-----
MIISQgIBADANBgkqhkiG9w0BAQEFAASCEiwwghIoAgEAAoIEAQCn8osm2V91Tbvm
92e01dctP7gb3zRltzr+8d5oAT9OE8EM7zOAyOr1R5eE8U00yS7RxbgaUg/0SsR8
V1+Y8/lYPhYaqpPr+F6gpkwAPK8GQaXVUPn8s7OZmJxHNtcbQXbJthVMk8LdGUg1
wMNLMlwiO76BUuQm/c+Hdoigmr4n+TILnjFcrM5eQBCQjB5Hl9LpXdM51KMqoebE
2DNvdZh6k6g2wm3NYH7p4E7rCd8ZY3FaEXm3Ba+x1n0mgkWt8StpIv5oX52mAas8
HrcHeFkftH46L1UrSLN8y4NmUsxZeMulTYx05PexR7BPq840X467jlorSuQ821Dl
onC3HiPMOTUPkJ274M8U8/dj7rwgzzrjtpLOs882U/cFXSL0mf50nCN175bd5jc5
eG87v9QApmvBEwkmyIAu64lmRZTUTairR+xCgeavgzPKFfzlqvDvo4fwL/aFC04i
QDlQWEvAAVLsJQ3cv4nhZf5VS4XnoRtzpIivGL7zRprG2FWTrwPPcEnTHTlyFVhB
sxOOwaD1NaS6wdZ94++O3UKquUNlLUXRV+4SPfsgQ9URdGgNsMyQht9AsnRLZD09
/N6VUH01f/bUiv7rLgG2dKC/k4CzoZOW13UL0PCpLFIB1SfDOrpEKEYDpEXMxXrN
D9JAewog40nbRsHA6UMb57LKghh4LTJc/7X0z8IqoChXAB0wukGNGGKlDco4KGBf
05Tb85IvzLRDsDr9ZNITvI2UlJ5BrgIeD21E39S/ej449VIklk3NAHSzvFWlVm6a
2JxOzxwYUAYRKNkCiGBh69CzVhcYcpDDIp1FwL2d7St8fqnukadCVuauhWETLUnO
LOqe/h+ZGpzjCNzJODk9X9PdG9LkhASnB8j5tEpc2Msx5bxpdylo/zgTi6WS+CFW
bseGHHBHZKhbFqmvQbG4kBBOEtEZqpGsRigpg6ralstvbuGFXUvXfiwoc0gebWiZ
FRbrGPJ7AyWPhCFFAJNSTYF7HrvM0PlBbUPHCXWzHesEkbHMmSOD1FBkvl6vMPld
XhGSqZ2Mph6zzhqoCIUqKbWjKFB9rUsoNfCte5i13IF49AxBFc3qD2dCB5L9or2i
ol+XUSx4jk/zidQhrDDel/aYY2ZMRi3xgSX5oieIflc5kCwoSlI7q88XYHRsJnRP
tTGiUNGOdpmARCY/05yPIAQRJuMGL+mEo/aXz2CwUaBt4mSIr3b3M6Xhh6PhPAZj
vrqxKvjRXNCCPtEnbEeN7q1xFJeFh6unagChJQPGIq/86pNXHOj3ONy+JpJgBDmV
8jHIeZo7S/hbAubZI39cWDP6VCQO0aon2h1N533a04dYEGKp+aKIsDJmx7T5CROQ
yL9yy5HPAgMBAAECggQAOGruWtkXy6CW2CJROLrDI4SttNM411iDnYQjud19Zh2V
suIh84fLAiWQHU0wKeTRcQ+R5mmdyWtacQiq6QdAQmfs5f1aXqEbLK1gh43bH+dq
rWub5st5MEZHbVbbUOEfZehgZE6Y3cwx6Ti9giPDNo7KUshFM2H81p03jXgeG/CG
4sc7/s1gL+ImjmA7hcJXTCTEIb+wJlCn5IVaVf1zgO3cSrTqzNy3FZrP9/3jb7Rr
rh2DvTtQR5XticOmY6XJ9vIV83r3Sv5xhussgfpoOhHYe3ROEJHGFcyJ8hQraHz/
MCMKZXRLTsbtz/2/cfGN0ayi1rs8S8NC/Dki0yjxTpgDHpzul+APwJKqDuxyTzU+
K6O30m8t0yrGpwsgBHo8s/CFqwcWr6k38PrnpvMsZSGCviPGZbxh7yEZkX0bX2xN
Fmi9UaQwmdIh0ierwn03ndDaCBIcppnjH/diKX7Xx4LKV+CktPy09T5df0q1C1gg
ECt77RILh063DMg8izV2OreWXTCKjSvlb4CYN9MM3oKsOT6HbtfksCHc1NwSa0kX
lJkMtR0UIMUYrNnlYH/9YCmmkqXAEll0hz/Mh+03eoLnqIOe2eMlGSU5oNGMoQtM
uJXdUGBakAH+9HWl+1vdmarLxkpnVkAangtMDnQmtWCU/W/aA5N4g0XE1ml4jdnZ
qy3TsPbqO4nYS60YSl4q0L5cus0/20utQ9OP1vKXhxVpFL3E6aXRD2SvcyOgLjOh
3/JSGa8t2vzTqFvFkvbeTOMXb6xmKWDCLJe3+Gb8zfSFtPBXdytIXxDJQZoHlzd2
ACYG4hEuNwY97Idg/geHLo2rggpWCy+akp6nBcYUN1vtIrUiraD/1KIdCs+MVgYm
gJ+CJxlhPpmtkqJ+FysvJqvs3GZqF1cB9v5zrErLHprNSmXpODewGTkFFhwq69z9
3oi6Gj2dPYwv1TbsZFYxv4P6g8ytDABthgr8u73oKZ7c3PPn4QgiRqWbheSuy2X7
FKczXLnvVoT0nW6+5zybehMGYHqDCV3jJd4Xf8IK80wAYB01NFcQkWh9pJwupQFh
Qouq30u/sxS9+3jpV5ZgtyFVDiD4SoYP5uuj+K9DajXXuFbWEI7Ozf2MuOUU0Jns
yEXWrqR7Zqv1l35mB3a4wSR/kLRrvJ1ekUbGrI5cgVi4TCxaieexPptyX0oa4JdT
Bu7LXKd+PBXOOBLaKpZvHWGqaLU1pugcisxRTUO9iATC34h8/ae9yO/XynQe89CT
vN//YjZlShCPb+DvoUogGl/NWfmoVDUqBNoZ2VxUtVanbAttne0S2cJkODNx6BGG
A/bktN15wyaMrxAu7Xz5jndmDTheScTPk89Q0onTCQKCAgEAzzZYp72AdIozTPC3
ZdTXQTtQmsO1zrTLVgRg3HcRb8t6sOQk78z1xc96r0MKetPErX1ycoqktxYf6TaN
rB03R453Wg3ySQTtbyQ5vlLoEjBn7J6/A0SR+wAaXlHSROPjOFr7qZ9icX5gcSQl
XGGp8dBpTkTB1gxqZVM4HbuCzGFoT7cvQpDIeTgcvKr3OW2o/oW/+FYJJMgMHUu1
ncrA+JBYZmBQlUPJZwAkkudDQlIyELMnyVU1CCV6MFS0NcRk5E99U0RXhpVUjQyS
KqbwBSTZsOyQ7PMFwty0cf8kwVs0OSYWelQvqlM5odEgk4tkTK5/4BSkWJ90l8C3
Q3mA73Q5KPZ3tLT1O3eEOV+h7v2/secm+TjV74yrbHqW8hsKpd3tw1u/M0/m7m9k
rnOYcKIc5Ek6sydjwnJlY2zAC3dPGiIKUwZz45A4EPeKGpUtxczNb8uzlufVAR3Y
kF73EoaXyn0/y6XGuA9kvJWaeNRfFtGB3LnaZg4EyqprCQYwl4+OJfGFJfS6Gt7K
bLWZC7ZT+LYFm5cElPNZJEuNIbK5o8y/A256van7VWAWVlIh2Wzq8lOZ1jWwKto+
4DhHLwsb4sje+S8enxShAJ6Fa8nVgaBLHP9bWNr2wI3MtJteoIlrQfwgfVrYVYlg
y87NRrmm2CV95Qqr4XdiNKwV72kCggIBAM99hVdWH4nJGYOYUMZjhuRyoL7NdDVA
lpllM0rhPdoRhFIPLYFBXhd00E3A2XHSmhnkgINaRCUJpMSjPx6NUpREje0P5fJ9
M3MW/eLQaGZSSfpHL2SSHBmS8gH7/G0f4+ifvAfFdhpORyyy/6BQotUo8JbCbjJ3
TAm3h9TDAMmazT51yNp2iOKFEWVErttR0G4s+nST7e9deT1FWKoXmcwCK0xriLX/
BEsLOCgcj5d3mkgyyGLBH2XEEtSeIEv+ZK/Tyrm1e5dks8Jg8kQSkQseUpJ7MQo5
Sgk1md/3hbO+QOK0VvYxdnTzJgL8DmTQazKUy9GYdfBVBplcaGI+PUKGOB4R7qT0
nK4LsqdAloUYEQpNOX2duvvkH0P9Ex/evJi+hheZKRojDSxJ0A5b6jBcf+J/bNaW
Nh2XMA/DA+vLbz88LJuzgQI7MJdTKc0MJBgvjjSbX9QiFarKfR5a3cRUBU5RBXwj
xqj1WWrUmCXDmGJCPL2yh6r68DNCRiBCzIDwILx8prKrrx+U0FjtIi2yLmJYGcCo
tbhHZ0FFnwRimEfCLPDj4jahcpOpwmHgbi5mVmyNd16PXKLFQdwnVQPpkVY967cB
1/SKuRNm6xHn3MVurV+ih0MSaoDvTyXfogOwS4LKiiN81QnkcZl/4zAWZi4XAN/a
sxy7Jk/2bgh3AoICAQCGX/P2M4oOCWFjT+de/jvpbZHEC47nUY9bZNN7pSuFmCsk
c48Qg5YOhZJF/e/Z32L4LxX8+bP/lzVyg5I0P24N1XHI0KqCd9OR86gOqK0evo1m
gTvV3q3cXCC9ccouKqq7bSUuxtGMUCwyswIXeq4+xqzDuQsKyFpnAyStA2C7MZ/3
sg/P1xxqn9zi7OwOLfMdu5bWcNTVKXXRubs5bLbfepwZJ/SaF6+QQCN3sMmJRMx6
z/PJOJx/f+5RUVzcUVQsSvA3A2bPPB/sqG5Rgpi8fT0+4urI/oCJ8Z6DHrazPXYM
aYrCIb4Xcok5SukZRZfxsmfy5O//GMj/cFZoR2852eEHk23lnkQ6IDN7EW1uEtgx
gnlfvV/fTRYN7yHcN3UcQ2NhASppGDPmBA8CoqwEvtyFnoeWjsC+5HijlW6lAOYn
SFPxq4mT1X7GYgEJZBye3UWMbkk0X3tekgBS/4KyXN4qzjaE1iicTD9DnLDkErTn
k03n2g6riAPLeeCXpY/1eX7xVELIboAR1NDo1os9cSvbag8Q60ppXbY9N1F6vPBu
LOTiUM8AGC+JGhriN7kDywJBy71DkOWBpK6JsXVYKJgY5bLTXZ86AqK2SBa149m1
ikGruF2Ard6+2DYcGXWwHe2UiPB42mTYc5J2GNI+Pz7XhNizo8v7FvR0u/QtoQKC
AgAjyqo6s4+DLB5rldWxMy/srl1OLJC0Mu0Hju53Jz2NJWJm6VlXJ5h8gVkBYJfh
y4trlgAZKHQC05QJm4Ni2Mv66Yx17T0kRDagzsGC46JurBk4xBjHx3BzdOasMvSL
OmoNEajUyloiFYivjD0OQXqlPIer6eQqbmu+bVtP90dmf36SHK1GChZ4xK2Ig32K
NaW3q6iUfYQYu04TpKezx5hvGZywdQhDJLdv3oKUYMDgRvBlLeVlK50n59e7t38o
vLxPnEAnIsgsCGH90M1Zsr40ZcmmnPuLoPBFgGqHuOHmbJYyxRsPIt8lM2BGOYae
G1mygvpZsGv/xhr6T3duIwBcPlzlywAYkl2IpFnwAfM1CD7AQSv+oDvGAcbm6nvn
DnwH+S2WWoQ9jvhRwHXUVESkjQA+aO60YXr6Rb8zqNc/UHtjNBUZ0rAZW255XA4k
4chEJ8fnCTpRlIOaT42fs9r3Z+r2ZIGGtYEqWhBPnlaUhRX/NR/XNTmz48+VeAQy
wnMWdtWezf3PalAuKXR7MoSnz0mzCzF+C1w1apPELadNkVhlYHhyIU0/UUA7epge
XCGFfX/A//IsbJx1M4O1308J+rtoXgwQKJBBDcD5ONKp5w4tPHdJvPaKOl4G2cEU
bmw7KKkN6bREhN8W8sIp0Wa2P9bmcm9jLg2hkiL8viyi5wKCAgBrkow1TIa5fgA6
8jrtEaKtGN7C4BoRKUJarqrhxeSopaVBlaf1mjXZ/LxwtOpxGq4+rcmgpWjYW1Lj
rEsQ05sloo0RheQeNFKrmCDk8XDGK1cJLM9ukjhyFhTJVL1rJT+mSom2zwlgZm/V
gNCCxVy9w8gQfKzIrqnTzXm+tWJPksnOcRbt30FclFB19aEdTm8xlPgZ6noKP7Wi
arKdC/VabXvU+siuK5+HnIFCsppuyyPzwTQ3H5TprB43b3sUpnkmFXa8hZYpj7A7
E7RLErP6SzRXdgxShqvp3DLCt87AqufeE0Qm7tbYpmzVnzvrxnE7AXQvbCiUp3cs
sf8RDRku6iyQIQE0dx6Owk41tCIIBD8n9nrhnVWUAdV1dg7G0xMXHtBItoV2xLya
Q9jBqTzFoA+J9xqVMTWyvlYuO7ybYYEXlNmjb1+CS+y2S0dVN39SfW+0me6V/0yc
X8CaBwW96dUNd3Hn0NkdMJzzouzHYKtwa9eBVjT8GyykTG/b//TIcSfh+B+eBR1k
3JfJhPT4yPJM+mSu8Giji3EjJSdAULxQ7ftiCIhNvcd427y0F9bay2AKdswr91li
NphD85b7VjbYq5fVev60SF10uhXViUNOP5+KZhWxhIfVIcOw+VkMDMssDIW+dwt1
pqMKlQdgkeJ7wn8KSJzYOuz1F8UkrQ==
-----END TESTING KEY-----
`
