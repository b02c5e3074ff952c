package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

type issueFlags struct {
	addr           string
	serverName     string
	caRoots        string
	tokenFile      string
	clusterID      string
	impersonate    string
	trustDomain    string
	namespace      string
	serviceAccount string
	ttl            time.Duration
	out            string
	certFile       string
	keyFile        string
	timeout        time.Duration
}

func newIssueCommand() *cobra.Command {
	f := &issueFlags{}
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Get an SVID from an Istio CA the way ztunnel does",
		Long: `issue generates a P-256 key and a CSR with an empty subject and one critical
URI SAN, sends it with the service-account token as a bearer header and the
clusterid header (and, with --impersonate, the workload's ID as
ImpersonatedIdentity, as ztunnel does for the pods on its node), checks the
reply as ztunnel does, and writes key.pem (0600), cert-chain.pem and
root-cert.pem to --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "ca-addr", "localhost:15012", "CA address host:port")
	fl.StringVar(&f.serverName, "server-name", "istiod.istio-system.svc", "name expected in the CA's serving certificate")
	fl.StringVar(&f.caRoots, "ca-roots", "", "PEM roots that verify the CA's serving certificate (required)")
	fl.StringVar(&f.tokenFile, "token-file", "", "service-account token (audience istio-ca), re-read on every request")
	fl.StringVar(&f.clusterID, "cluster-id", ca.DefaultClusterID, "clusterid header")
	fl.StringVar(&f.impersonate, "impersonate", "", "ask for this workload SPIFFE ID on its behalf (node proxy mode)")
	fl.StringVar(&f.trustDomain, "trust-domain", ca.DefaultTrustDomain, "trust domain of the caller's own identity")
	fl.StringVar(&f.namespace, "namespace", "", "caller's namespace; read from the token when empty")
	fl.StringVar(&f.serviceAccount, "service-account", "", "caller's service account; read from the token when empty")
	fl.DurationVar(&f.ttl, "ttl", 24*time.Hour, "requested validity")
	fl.StringVar(&f.out, "out", ".", "directory for key.pem, cert-chain.pem and root-cert.pem")
	fl.StringVar(&f.certFile, "cert", "", "client certificate chain (renewal with a still-valid SVID)")
	fl.StringVar(&f.keyFile, "key", "", "client certificate key")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "request deadline")
	return cmd
}

func (f *issueFlags) identity() (spiffeid.ID, bool, error) {
	if f.impersonate != "" {
		id, err := spiffeid.FromString(f.impersonate)
		if err != nil {
			return id, false, fmt.Errorf("--impersonate: %w", err)
		}
		return id, true, nil
	}
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return spiffeid.ID{}, false, fmt.Errorf("--trust-domain: %w", err)
	}
	ns, sa := f.namespace, f.serviceAccount
	if (ns == "" || sa == "") && f.tokenFile != "" {
		tns, tsa, err := tokenSubject(f.tokenFile)
		if err != nil {
			return spiffeid.ID{}, false, err
		}
		ns, sa = cmpOr(ns, tns), cmpOr(sa, tsa)
	}
	if ns == "" || sa == "" {
		return spiffeid.ID{}, false, errors.New("cannot tell the caller's identity: give --namespace and --service-account, or a --token-file")
	}
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	return id, false, err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// tokenSubject reads namespace and service account from a service-account
// token's claims, without verifying it: the CA does that.
func tokenSubject(path string) (ns, sa string, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("--token-file: %w", err)
	}
	claims, err := kube.ReadClaims(strings.TrimSpace(string(raw)))
	if err != nil {
		return "", "", fmt.Errorf("--token-file: %w", err)
	}
	return claims.Namespace, claims.ServiceAccount, nil
}

func (f *issueFlags) run(cmd *cobra.Command) error {
	if f.caRoots == "" {
		return errors.New("--ca-roots is required: the CA's serving certificate must be verified")
	}
	rootsPEM, err := os.ReadFile(f.caRoots)
	if err != nil {
		return fmt.Errorf("--ca-roots: %w", err)
	}
	roots, err := pemutil.ParseCertificates(rootsPEM)
	if err != nil {
		return fmt.Errorf("--ca-roots: %w", err)
	}
	pool := certs.Pool(roots...)
	id, impersonate, err := f.identity()
	if err != nil {
		return err
	}
	cfg := caclient.Config{Addr: f.addr, ServerName: f.serverName, Roots: pool, TokenFile: f.tokenFile, ClusterID: f.clusterID}
	if f.certFile != "" || f.keyFile != "" {
		c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return fmt.Errorf("--cert/--key: %w", err)
		}
		cfg.Certificate = &c
	}
	client, err := caclient.New(cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := contextWithTimeout(cmd, f.timeout)
	defer cancel()
	svid, err := client.Fetch(ctx, id, caclient.Options{Impersonate: impersonate, TTL: f.ttl})
	if err != nil {
		return fmt.Errorf("CreateCertificate: %w", err)
	}
	if err := svid.WriteFiles(f.out); err != nil {
		return err
	}
	leaf := svid.Chain[0]
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "SPIFFE ID:  %s\n", svid.ID)
	fmt.Fprintf(w, "serial:     %s\n", leaf.SerialNumber.Text(16))
	fmt.Fprintf(w, "valid:      %s to %s (%s)\n", leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), leaf.NotAfter.Sub(leaf.NotBefore).Round(time.Second))
	fmt.Fprintf(w, "issuer:     %s\n", leaf.Issuer)
	fmt.Fprintf(w, "chain:      %d certificate(s) + %d root(s)\n", len(svid.Chain), len(svid.Roots))
	for _, name := range []string{caclient.FileKey, caclient.FileChain, caclient.FileRoots} {
		fmt.Fprintf(w, "wrote:      %s\n", filepath.Join(f.out, name))
	}
	return nil
}
