// Package caclient asks an Istio-compatible CA for an SVID exactly as
// ztunnel does: a fresh P-256 key, a CSR with an empty subject and one
// critical URI SAN, the service-account token as a bearer header, the
// clusterid header, and in node-proxy mode the workload's ID in the
// ImpersonatedIdentity metadata field. It checks the reply as ztunnel does.
package caclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/internal/atomicfile"
	"github.com/meshca/meshca/internal/pemutil"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// Config of a client.
type Config struct {
	// Addr is host:port of the CA.
	Addr string
	// ServerName is the name checked in the CA's serving certificate
	// (ztunnel: the host of CA_ADDRESS, istiod.istio-system.svc).
	ServerName string
	// Roots verify the CA's serving certificate.
	Roots *x509.CertPool
	// TokenFile is re-read on every request, as ztunnel does; empty sends
	// no authorization header.
	TokenFile string
	// ClusterID is sent as the clusterid header; empty sends none.
	ClusterID string
	// Certificate, when set, is presented as a client certificate (renewal).
	Certificate *tls.Certificate
	// VerifyConnection, when set, is called on every TLS handshake once
	// the CA's serving certificate has verified (tls.Config's): a test
	// sees which certificate each connection got.
	VerifyConnection func(tls.ConnectionState) error
}

// Client talks to one CA.
type Client struct {
	cfg  Config
	conn *grpc.ClientConn
	api  authpb.IstioCertificateServiceClient
}

// New returns a client; the connection is made lazily by the first call.
func New(cfg Config) (*Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.Roots, ServerName: cfg.ServerName, VerifyConnection: cfg.VerifyConnection}
	if cfg.Certificate != nil {
		tc.Certificates = []tls.Certificate{*cfg.Certificate}
	}
	conn, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("caclient: %w", err)
	}
	return &Client{cfg: cfg, conn: conn, api: authpb.NewIstioCertificateServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Options of one request.
type Options struct {
	// Impersonate asks for id on behalf of a workload (node-proxy mode)
	// instead of for the caller's own identity.
	Impersonate bool
	// TTL is the requested validity; ztunnel asks for 24h.
	TTL time.Duration
	// ImpersonatedIdentity, when set with Impersonate, is sent verbatim in
	// place of the requested ID (to probe a CA with malformed values).
	ImpersonatedIdentity string
}

// SVID is what the CA issued, checked.
type SVID struct {
	ID  spiffeid.ID
	Key crypto.Signer
	// Chain is the leaf followed by the intermediates.
	Chain []*x509.Certificate
	// Roots is the trust bundle from the last element of the reply.
	Roots []*x509.Certificate
}

// Fetch generates a key and asks the CA for an SVID for id.
func (c *Client) Fetch(ctx context.Context, id spiffeid.ID, o Options) (*SVID, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("caclient: generate key: %w", err)
	}
	csrPEM, err := csr.Build(key, id)
	if err != nil {
		return nil, err
	}
	chain, err := c.Call(ctx, string(csrPEM), id, o)
	if err != nil {
		return nil, err
	}
	return Check(chain, id, key)
}

// Call sends one CreateCertificate request with csrPEM and returns the raw
// cert_chain.
func (c *Client) Call(ctx context.Context, csrPEM string, id spiffeid.ID, o Options) ([]string, error) {
	if o.TTL <= 0 {
		o.TTL = 24 * time.Hour
	}
	md := metadata.MD{}
	if c.cfg.TokenFile != "" {
		tok, err := os.ReadFile(c.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("caclient: read token: %w", err)
		}
		md.Set(authpb.HeaderAuthorization, authpb.BearerPrefix+strings.TrimSpace(string(tok)))
	}
	if c.cfg.ClusterID != "" {
		md.Set(authpb.HeaderClusterID, c.cfg.ClusterID)
	}
	req := &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: int64(o.TTL / time.Second)}
	if o.Impersonate {
		v := id.String()
		if o.ImpersonatedIdentity != "" {
			v = o.ImpersonatedIdentity
		}
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			authpb.MetaImpersonatedIdentity: structpb.NewStringValue(v),
		}}
	}
	resp, err := c.api.CreateCertificate(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		return nil, err
	}
	return resp.GetCertChain(), nil
}

// Check validates a reply the way ztunnel does: at least two elements, the
// last holding the roots; a leaf whose first URI SAN is id and whose key is
// key's; and a chain that verifies to those roots.
func Check(chain []string, id spiffeid.ID, key crypto.Signer) (*SVID, error) {
	if len(chain) < 2 {
		return nil, errors.New("caclient: no root certificate present in the reply")
	}
	var certs []*x509.Certificate
	for i, p := range chain[:len(chain)-1] {
		cs, err := pemutil.ParseCertificates([]byte(p))
		if err != nil || len(cs) != 1 {
			return nil, fmt.Errorf("caclient: cert_chain[%d] is not one PEM certificate: %v", i, err)
		}
		certs = append(certs, cs[0])
	}
	roots, err := pemutil.ParseCertificates([]byte(chain[len(chain)-1]))
	if err != nil {
		return nil, fmt.Errorf("caclient: trust bundle (last element): %w", err)
	}
	leaf := certs[0]
	if len(leaf.URIs) == 0 || leaf.URIs[0].String() != id.String() {
		return nil, fmt.Errorf("caclient: leaf identity %v does not match the requested %s", leaf.URIs, id)
	}
	if !csr.SamePublicKey(leaf.PublicKey, key.Public()) {
		return nil, errors.New("caclient: leaf does not certify our key")
	}
	got, _, err := x509svid.Verify(certs, x509bundle.FromX509Authorities(id.TrustDomain(), roots))
	if err != nil {
		return nil, fmt.Errorf("caclient: chain does not verify to the returned roots: %w", err)
	}
	return &SVID{ID: got, Key: key, Chain: certs, Roots: roots}, nil
}

// Files written by WriteFiles, as istio-agent lays them out.
const (
	FileKey   = "key.pem"
	FileChain = "cert-chain.pem"
	FileRoots = "root-cert.pem"
)

// WriteFiles writes key.pem (0600), cert-chain.pem and root-cert.pem to
// dir, each atomically.
func (s *SVID) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("caclient: %w", err)
	}
	keyPEM, err := pemutil.EncodePrivateKey(s.Key)
	if err != nil {
		return fmt.Errorf("caclient: encode key: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{FileKey, keyPEM, 0o600},
		{FileChain, pemutil.EncodeCertificates(s.Chain...), 0o644},
		{FileRoots, pemutil.EncodeCertificates(s.Roots...), 0o644},
	} {
		if err := atomicfile.WriteFile(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return err
		}
	}
	return nil
}

// TLSCertificate returns the SVID as a client certificate for renewal.
func (s *SVID) TLSCertificate() *tls.Certificate {
	c := &tls.Certificate{PrivateKey: s.Key, Leaf: s.Chain[0]}
	for _, x := range s.Chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}
