package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/csr"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// requireRefusal fails unless err is an *Error with one of the codes.
func requireRefusal(t *testing.T, err error, want ...codes.Code) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *ca.Error", err, err)
	}
	for _, c := range want {
		if e.Code == c && e.Reason != "" && e.Msg != "" {
			return e
		}
	}
	t.Fatalf("refusal %v has code %v, want one of %v with a reason and a message", e, e.Code, want)
	return nil
}

// FuzzRequestMessage feeds the server's reading of a CreateCertificate
// message any wire bytes: the server's codec (requestCodec), then the
// ImpersonatedIdentity metadata (requestedIdentity, parseTarget) and the
// requested TTL (Server.ttl). None may panic. The codec hands the handler
// every message: what protobuf decodes, as it decodes it; anything else
// empty, with the error to take once. The identity asked for is
// the metadata's string exactly, a value of another kind is
// InvalidArgument, and an accepted target is one workload ID of our trust
// domain, written as sent. A TTL is either refused as InvalidArgument,
// only when above the maximum, or lies in (0, MaxTTL]: the requested
// seconds when positive, the default otherwise, and never more than
// CertRenewalTTL for a renewal by certificate.
func FuzzRequestMessage(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
	pemCSR, err := csr.Build(key, id)
	if err != nil {
		f.Fatal(err)
	}
	add := func(in *authpb.IstioCertificateRequest) {
		b, err := proto.Marshal(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	meta := func(v *structpb.Value) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{metaImpersonate: v}}
	}
	// What ztunnel sends for a workload on its node, and istio-agent for itself.
	add(&authpb.IstioCertificateRequest{Csr: string(pemCSR), ValidityDuration: 86400, Metadata: meta(structpb.NewStringValue(id.String()))})
	add(&authpb.IstioCertificateRequest{Csr: string(pemCSR), ValidityDuration: 86400})
	add(&authpb.IstioCertificateRequest{Csr: string(pemCSR), ValidityDuration: -1, Metadata: meta(structpb.NewNumberValue(1))})
	add(&authpb.IstioCertificateRequest{ValidityDuration: math.MaxInt64, Metadata: meta(structpb.NewListValue(&structpb.ListValue{
		Values: []*structpb.Value{structpb.NewStringValue(id.String()), structpb.NewStringValue(id.String())}}))})
	add(&authpb.IstioCertificateRequest{ValidityDuration: math.MinInt64, Metadata: meta(structpb.NewStringValue("spiffe://evil.example/ns/shop/sa/cart"))})
	add(&authpb.IstioCertificateRequest{Metadata: meta(structpb.NewStructValue(meta(structpb.NewStringValue(id.String()))))})
	add(&authpb.IstioCertificateRequest{Metadata: meta(structpb.NewStringValue("spiffe://cluster.local/ns/shop/sa/cart/../../x"))})
	add(&authpb.IstioCertificateRequest{Metadata: meta(structpb.NewNullValue())})
	f.Add([]byte{0x0a, 0x01, 0xff}) // a csr field that is not UTF-8: protobuf refuses it
	f.Add([]byte{})

	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	a := &NodeAuthorizer{TrustDomain: td}
	s := &Server{c: Config{DefaultTTL: DefaultTTL, MaxTTL: DefaultMaxTTL, CertRenewalTTL: time.Hour}}
	codec := newRequestCodec()
	f.Fuzz(func(t *testing.T, wire []byte) {
		var in, want authpb.IstioCertificateRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &in); err != nil {
			t.Fatalf("the codec refused a request instead of handing it to the handler: %v", err)
		}
		decodeErr, wantErr := codec.takeError(&in), proto.Unmarshal(wire, &want)
		switch {
		case (decodeErr == nil) != (wantErr == nil):
			t.Fatalf("the codec says %v, protobuf %v", decodeErr, wantErr)
		case codec.takeError(&in) != nil:
			t.Fatal("the codec's error was taken twice")
		case decodeErr != nil && proto.Size(&in) != 0:
			t.Fatalf("a request that does not decode reached the handler with %v", &in)
		case decodeErr != nil:
			return
		case !proto.Equal(&in, &want):
			t.Fatalf("the codec decoded %v, protobuf %v", &in, &want)
		}
		requested, err := requestedIdentity(&in)
		v, present := in.GetMetadata().GetFields()[metaImpersonate]
		switch {
		case err != nil:
			requireRefusal(t, err, codes.InvalidArgument)
			if _, isString := v.GetKind().(*structpb.Value_StringValue); !present || isString {
				t.Fatalf("refused a string or absent ImpersonatedIdentity: %v", err)
			}
		case !present && requested != "":
			t.Fatalf("no ImpersonatedIdentity, yet %q is requested", requested)
		case present && requested != v.GetStringValue():
			t.Fatalf("requested %q, the metadata says %q", requested, v.GetStringValue())
		}
		if err == nil && requested != "" {
			target, err := a.parseTarget(requested)
			if err != nil {
				requireRefusal(t, err, codes.InvalidArgument, codes.PermissionDenied)
			} else if ns, sa, ok := parseWorkloadID(target); !ok || !target.MemberOf(td) || target.String() != requested || ns == "" || sa == "" {
				t.Fatalf("accepted %q as %v", requested, target)
			}
		}
		for _, method := range []string{MethodToken, MethodCertificate} {
			ttl, err := s.ttl(in.GetValidityDuration(), &Caller{Method: method})
			if err != nil {
				requireRefusal(t, err, codes.InvalidArgument)
				if in.GetValidityDuration() <= int64(DefaultMaxTTL/time.Second) {
					t.Fatalf("refused TTL %ds, not above the maximum: %v", in.GetValidityDuration(), err)
				}
				continue
			}
			switch secs := in.GetValidityDuration(); {
			case ttl <= 0 || ttl > DefaultMaxTTL:
				t.Fatalf("TTL %ds gave %v, outside (0, %v]", secs, ttl, DefaultMaxTTL)
			case method == MethodCertificate && ttl > time.Hour:
				t.Fatalf("a renewal by certificate got %v, above CertRenewalTTL", ttl)
			case method == MethodToken && secs > 0 && ttl != time.Duration(secs)*time.Second:
				t.Fatalf("TTL %ds gave %v", secs, ttl)
			case method == MethodToken && secs <= 0 && ttl != DefaultTTL:
				t.Fatalf("TTL %ds gave %v, want the default", secs, ttl)
			}
		}
	})
}

// fuzzAddr is a peer address as the transport reports it.
type fuzzAddr string

func (a fuzzAddr) Network() string { return "tcp" }
func (a fuzzAddr) String() string  { return string(a) }

var _ net.Addr = fuzzAddr("")

// FuzzRequestHeaders feeds the reading of a request's headers any
// authorization, clusterid and x-request-id values, each sent zero, one
// or more times: credentialsFrom and requestID. Neither may panic. A
// header sent more than once, and an authorization that is not "Bearer
// <token>" or a token over the limit, are Unauthenticated; a token read is
// what followed the bearer prefix, trimmed and within the limit; the
// cluster id is the header as sent. The request id is the client's when
// it is one printable token of at most 128 characters, else a fresh one,
// and always such a token.
func FuzzRequestHeaders(f *testing.F) {
	const maxToken = 1024
	token := "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6aXN0aW8tc3lzdGVtOnp0dW5uZWwifQ.c2ln"
	f.Add("Bearer "+token, uint8(1), "Kubernetes", uint8(1), "6b1f7e3c9a0d4e2f8b5c1a7d3e9f0b2c", uint8(1), "10.0.0.7:51234")
	f.Add("bearer  "+token+" ", uint8(1), "", uint8(0), "", uint8(0), "[fd00::7]:51234")
	f.Add("Bearer "+token, uint8(2), "east", uint8(2), "id with space", uint8(1), "")
	f.Add("Basic dXNlcjpwYXNz", uint8(1), "Kubernetes", uint8(1), strings.Repeat("x", 129), uint8(1), "10.0.0.7")
	f.Add("Bearer "+strings.Repeat("a", maxToken+1), uint8(1), "", uint8(0), "a\"b", uint8(2), "@")
	f.Add("Bearer", uint8(1), "", uint8(0), "", uint8(0), "")
	f.Fuzz(func(t *testing.T, auth string, nAuth uint8, cluster string, nCluster uint8, reqID string, nReqID uint8, addr string) {
		md := metadata.MD{}
		for range nAuth % 3 {
			md.Append(headerAuthorization, auth)
		}
		for range nCluster % 3 {
			md.Append(headerClusterID, cluster)
		}
		for range nReqID % 3 {
			md.Append(RequestIDHeader, reqID)
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: fuzzAddr(addr)})
		c, gotAddr, err := credentialsFrom(ctx, maxToken)
		if err != nil {
			requireRefusal(t, err, codes.Unauthenticated)
			v := strings.TrimSpace(auth)
			wellFormed := len(v) >= len(bearerPrefix) && strings.EqualFold(v[:len(bearerPrefix)], bearerPrefix) &&
				len(strings.TrimSpace(v[len(bearerPrefix):])) <= maxToken
			if nAuth%3 == 1 && wellFormed && nCluster%3 <= 1 {
				t.Fatalf("refused one well-formed authorization and at most one clusterid: %v", err)
			}
		} else {
			switch {
			case nAuth%3 > 1 || nCluster%3 > 1:
				t.Fatal("accepted a header sent twice")
			case nAuth%3 == 0 && c.Token != "":
				t.Fatalf("token %q without an authorization header", c.Token)
			case nAuth%3 == 1 && (len(c.Token) > maxToken || c.Token != strings.TrimSpace(c.Token) || !strings.HasSuffix(strings.TrimSpace(auth), c.Token)):
				t.Fatalf("authorization %q read as token %q", auth, c.Token)
			case nAuth%3 == 1 && !strings.EqualFold(strings.TrimSpace(auth)[:len(bearerPrefix)], bearerPrefix):
				t.Fatalf("authorization %q accepted without the bearer prefix", auth)
			case nCluster%3 == 1 && c.ClusterID != cluster, nCluster%3 == 0 && c.ClusterID != "":
				t.Fatalf("clusterid %q (%d times) read as %q", cluster, nCluster%3, c.ClusterID)
			case gotAddr != addr:
				t.Fatalf("peer %q read as %q", addr, gotAddr)
			}
		}
		got := requestID(ctx)
		switch {
		case !validRequestID(got) || len(got) > maxRequestIDLen:
			t.Fatalf("request id %q is not one printable token", got)
		case nReqID%3 == 1 && validRequestID(reqID) && got != reqID:
			t.Fatalf("the client's request id %q was replaced by %q", reqID, got)
		case (nReqID%3 != 1 || !validRequestID(reqID)) && got == reqID:
			t.Fatalf("the request id %q was kept, sent %d times", reqID, nReqID%3)
		}
	})
}
