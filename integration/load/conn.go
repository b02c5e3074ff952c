// Package load drives meshca the way its clients load it, and measures
// what that costs: requests/s, latencies, the CPU time of each process
// involved, and this machine's raw limit for the work no CA can skip.
// cmd/loadgen (make bench-load) and the signers benchmarks use it.
package load

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Target is how the load reaches meshca: its address and the roots its
// serving certificate chains to.
type Target struct {
	Addr  string
	Roots *x509.CertPool
}

// Conn is one client connection as ztunnel makes it: TLS to meshca with
// ztunnel's server name, and its token and cluster id on every request.
// It is lean on purpose: the client shares the machine's cores with
// meshca, so it neither re-reads its token nor verifies the replies.
type Conn struct {
	cc  *grpc.ClientConn
	api authpb.IstioCertificateServiceClient
	ctx context.Context // carries the headers
}

// Dial returns a connection with token, connected lazily by the first
// request (a restarted ztunnel's first requests wait for its handshake).
func (t Target) Dial(token string) (*Conn, error) { return t.DialFrom(nil, token) }

// DialFrom is Dial from the source address src (any 127/8 address on
// Linux's loopback), as a client on a host of its own; nil lets the
// kernel choose.
func (t Target) DialFrom(src net.IP, token string) (*Conn, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: t.Roots, ServerName: "istiod.istio-system.svc"}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if src != nil {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	cc, err := grpc.NewClient(t.Addr, opts...)
	if err != nil {
		return nil, err
	}
	return (&Conn{cc: cc, api: authpb.NewIstioCertificateServiceClient(cc)}).WithToken(token), nil
}

// WithToken returns a Conn on the same connection that sends token
// instead, as a ztunnel does after its token is renewed. Closing either
// closes the connection.
func (c *Conn) WithToken(token string) *Conn {
	md := metadata.Pairs(authpb.HeaderAuthorization, authpb.BearerPrefix+token, authpb.HeaderClusterID, "Kubernetes")
	return &Conn{cc: c.cc, api: c.api, ctx: metadata.NewOutgoingContext(context.Background(), md)}
}

// DialN opens n connections with token and sends warm on each, so that
// the TLS handshakes and the TokenReview are done before a measurement.
func (t Target) DialN(n int, token string, warm *authpb.IstioCertificateRequest) ([]*Conn, error) {
	conns := make([]*Conn, n)
	for i := range conns {
		c, err := t.Dial(token)
		if err != nil {
			CloseAll(conns)
			return nil, err
		}
		conns[i] = c
		if err := c.Call(warm); err != nil {
			CloseAll(conns)
			return nil, fmt.Errorf("first request: %w", err)
		}
	}
	return conns, nil
}

// Call sends one request and checks only that the reply holds a chain
// and a bundle.
func (c *Conn) Call(req *authpb.IstioCertificateRequest) error {
	_, err := c.Reply(req)
	return err
}

// Reply sends one request and returns its cert_chain.
func (c *Conn) Reply(req *authpb.IstioCertificateRequest) ([]string, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	resp, err := c.api.CreateCertificate(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(resp.GetCertChain()) < 2 {
		return nil, errors.New("reply holds no trust bundle")
	}
	return resp.GetCertChain(), nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.cc.Close() }

// CloseAll closes every connection of conns that is not nil.
func CloseAll(conns []*Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
