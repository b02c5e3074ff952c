package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/serve"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type explainFlags struct {
	cluster        clusterFlags
	trustDomain    string
	audiences      []string
	nodeAccounts   []string
	nodeProxyDeny  []string
	caAccount      string
	tokenFile      string
	namespace      string
	serviceAccount string
	pod            string
	identity       string
	timeout        time.Duration
}

func newExplainCommand() *cobra.Command {
	f := &explainFlags{}
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Explain, check by check, what the CA would decide for a caller and a requested identity",
		Long: `explain runs the checks of a CreateCertificate request against the cluster
without signing anything: TokenReview of the caller's token (or the caller
given as namespace, service account and Pod), the caller's Pod, the trusted
node accounts, the requested identity and the node the workload must run on.
It prints each check with its input and verdict and ends with the gRPC code
a real request would get.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd.Context(), cmd.OutOrStdout()) },
	}
	fl := cmd.Flags()
	f.cluster.register(fl, "the cluster whose TokenReview and Pods are asked")
	fl.StringVar(&f.trustDomain, "trust-domain", ca.DefaultTrustDomain, "SPIFFE trust domain")
	fl.StringSliceVar(&f.audiences, "token-audiences", []string{kube.DefaultAudience}, "audiences a token must carry (one of)")
	fl.StringSliceVar(&f.nodeAccounts, "trusted-node-accounts", []string{ca.DefaultNodeAccount}, "trusted node proxy accounts, as the server has them")
	fl.StringSliceVar(&f.nodeProxyDeny, "node-proxy-deny", ca.DefaultNodeProxyDeny(), "namespaces, accounts and account prefixes (ns/prefix*) denied to node proxies, as the server has them")
	fl.StringVar(&f.caAccount, "ca-service-account", "", "namespace/serviceaccount meshca runs as, which serve denies to node proxies besides --node-proxy-deny; empty: the account of explain's own credentials, learnt as serve learns its own (right when explain runs in meshca's Pod, or with its kubeconfig)")
	fl.StringVar(&f.tokenFile, "token-file", "", "the caller's service-account token")
	fl.StringVar(&f.namespace, "namespace", "", "the caller's namespace (without --token-file)")
	fl.StringVar(&f.serviceAccount, "service-account", "", "the caller's service account (without --token-file)")
	fl.StringVar(&f.pod, "pod", "", "the caller's Pod (without --token-file)")
	fl.StringVar(&f.identity, "identity", "", "the requested SPIFFE ID (ImpersonatedIdentity); empty for the caller's own")
	fl.DurationVar(&f.timeout, "timeout", 30*time.Second, "deadline for the checks")
	return cmd
}

func (f *explainFlags) run(ctx context.Context, w io.Writer) error {
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return fmt.Errorf("--trust-domain: %w", err)
	}
	accounts, err := ca.ParseNodeAccounts(f.nodeAccounts)
	if err != nil {
		return fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	cfg, err := f.cluster.restConfig()
	if err != nil {
		return err
	}
	deny, err := f.denyList(cfg)
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	pods := kube.APIPods{Client: kc}
	req := ca.ExplainRequest{
		Reviewer:   &ca.TokenAuthenticator{Reviewer: &kube.TokenReviewer{TrustDomain: td, Client: kc, Audiences: f.audiences}},
		Authorizer: &ca.NodeAuthorizer{TrustDomain: td, TrustedNodeAccounts: accounts, NodeProxyDeny: deny, Pods: pods},
		Requested:  f.identity,
	}
	switch {
	case f.tokenFile != "":
		raw, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		req.Token = strings.TrimSpace(string(raw))
	case f.namespace != "" && f.serviceAccount != "":
		if req.Caller, err = f.caller(ctx, td, pods); err != nil {
			return err
		}
	default:
		return errors.New("give the caller: --token-file, or --namespace and --service-account (and --pod for a node proxy)")
	}
	e := ca.Explain(ctx, req)
	printExplanation(w, e)
	return nil
}

// denyList is the deny list serve would have: --node-proxy-deny's
// entries, and meshca's own account (--ca-service-account, else the
// account of cfg's credentials, serve.OwnAccount).
func (f *explainFlags) denyList(cfg *rest.Config) (*ca.DenyList, error) {
	deny, err := ca.ParseNodeProxyDeny(f.nodeProxyDeny)
	if err != nil {
		return nil, fmt.Errorf("--node-proxy-deny: %w", err)
	}
	ns, sa, ok := strings.Cut(f.caAccount, "/")
	if f.caAccount == "" {
		if ns, sa, ok, err = serve.OwnAccount(cfg); err != nil {
			return nil, err
		}
	}
	if !ok {
		if f.caAccount != "" {
			return nil, fmt.Errorf("--ca-service-account %q is not namespace/serviceaccount", f.caAccount)
		}
		return deny, nil
	}
	if deny, err = deny.WithOwn(ns, sa); err != nil {
		return nil, fmt.Errorf("--ca-service-account: %w", err)
	}
	return deny, nil
}

// caller builds the caller a bound token of the Pod would authenticate as.
func (f *explainFlags) caller(ctx context.Context, td spiffeid.TrustDomain, pods kube.APIPods) (*ca.Caller, error) {
	id, err := spiffeid.FromSegments(td, "ns", f.namespace, "sa", f.serviceAccount)
	if err != nil {
		return nil, fmt.Errorf("--namespace/--service-account: %w", err)
	}
	c := &ca.Caller{ID: id, Namespace: f.namespace, ServiceAccount: f.serviceAccount, PodName: f.pod, Method: "explain"}
	if f.pod != "" {
		p, err := pods.Pod(ctx, f.namespace, f.pod)
		if err != nil {
			return nil, fmt.Errorf("--pod: %w", err)
		}
		if p == nil {
			return nil, fmt.Errorf("--pod: Pod %s/%s does not exist", f.namespace, f.pod)
		}
		c.PodUID, c.Node = p.UID, p.Node
	}
	return c, nil
}

func printExplanation(w io.Writer, e *ca.Explanation) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tINPUT\tVERDICT")
	for _, s := range e.Steps {
		verdict := "ok"
		if s.Note != "" {
			verdict += ": " + s.Note
		}
		if s.Err != nil {
			verdict = "FAIL: " + unwrapDetail(s.Err)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Check, s.Input, verdict)
	}
	_ = tw.Flush()
	o := e.Outcome
	if o.Code == codes.OK {
		fmt.Fprintf(w, "\nresult: OK: a request with a CSR for exactly %s would get an SVID\n", e.Identity)
		return
	}
	fmt.Fprintf(w, "\nresult: %s (%s)\n  client sees: %s\n", o.Code, o.Reason, o.Msg)
}

// unwrapDetail returns the innermost detail of a refusal.
func unwrapDetail(err error) string {
	var ce *ca.Error
	if errors.As(err, &ce) && ce.Err != nil {
		return ce.Reason + ": " + ce.Err.Error()
	}
	return err.Error()
}
