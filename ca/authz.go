package ca

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/ca/limit"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
)

// PodSource answers the Pod questions authorization asks. *PodIndex is
// the production implementation.
type PodSource interface {
	// Pod returns the Pod ns/name, or nil when there is none.
	Pod(ctx context.Context, ns, name string) (*kube.PodInfo, error)
	// OnNode returns the not-terminated Pods of ns/sa on node.
	OnNode(ctx context.Context, ns, sa, node string) ([]kube.PodInfo, error)
	// OfAccount returns the live Pods of ns/sa on any node.
	OfAccount(ctx context.Context, ns, sa string) ([]kube.PodInfo, error)
}

// NodeAuthorizer decides which identity a request may receive. A caller
// always may receive its own; a trusted node proxy (ztunnel) may receive
// the identity of a workload that runs on its own node.
type NodeAuthorizer struct {
	TrustDomain spiffeid.TrustDomain
	// TrustedNodeAccounts are "namespace/serviceaccount" entries.
	TrustedNodeAccounts map[string]bool
	// NodeProxyDeny are the identities no node proxy may receive for
	// another, whatever runs on its node (ParseNodeProxyDeny, and the
	// CA's own account); nil denies none.
	NodeProxyDeny *DenyList
	// Pods is nil when no cluster access is configured: then no caller may
	// impersonate and bound Pods are not re-checked.
	Pods PodSource
}

// Step is one check of a decision, for `meshca explain`.
type Step struct {
	Check string
	Input string
	// Err is nil when the check passed.
	Err error
	// Note says what a passed check found.
	Note string
}

// Decision is what authorization decided for one request.
type Decision struct {
	// ID is the identity the request may receive.
	ID spiffeid.ID
	// ProxyNode is the node of the caller when it is a trusted node proxy
	// (a ztunnel asking for a workload of its node, or for its own
	// identity): the certificate is issued through that node's proxy, and
	// a block of the node (NodeBlocks) refuses it. Empty for other callers,
	// and for a node proxy whose node is not known.
	ProxyNode string
}

// Authorize returns the identity the caller may receive for a request that
// asked for requested ("" for the caller's own identity).
func (a *NodeAuthorizer) Authorize(ctx context.Context, c *Caller, requested string) (spiffeid.ID, error) {
	d, err := a.authorize(ctx, c, requested, nil)
	return d.ID, err
}

// Decide is Authorize that also says through which node proxy, if any,
// the identity is issued.
func (a *NodeAuthorizer) Decide(ctx context.Context, c *Caller, requested string) (Decision, error) {
	return a.authorize(ctx, c, requested, nil)
}

// Trace is Authorize that also reports every check it makes.
func (a *NodeAuthorizer) Trace(ctx context.Context, c *Caller, requested string, trace func(Step)) (spiffeid.ID, error) {
	d, err := a.authorize(ctx, c, requested, trace)
	return d.ID, err
}

// authorize decides; trace, when not nil, hears every check. Without it
// (the request path) the inputs and notes of passed checks are not built.
func (a *NodeAuthorizer) authorize(ctx context.Context, c *Caller, requested string, trace func(Step)) (Decision, error) {
	tracing := trace != nil
	check := func(name, input string, err error, note string) error {
		if tracing {
			trace(Step{Check: name, Input: input, Err: err, Note: note})
		}
		return err
	}
	if requested == "" {
		return a.own(ctx, c, check, tracing)
	}
	target, err := a.parseTarget(requested)
	if err != nil {
		return Decision{}, check("requested identity", requested, err, "")
	}
	if tracing {
		_ = check("requested identity", requested, nil, "well-formed, in trust domain "+a.TrustDomain.Name())
	}
	if target == c.ID {
		return a.authorize(ctx, c, "", trace)
	}
	const denied = "this caller may not request other identities"
	account := c.Namespace + "/" + c.ServiceAccount
	switch {
	case !a.TrustedNodeAccounts[account]:
		return Decision{}, check("trusted node account", account, refuse(codes.PermissionDenied, "untrusted_caller", denied,
			fmt.Errorf("%s is not a trusted node account (trusted: %v)", account, keys(a.TrustedNodeAccounts))), "")
	case a.Pods == nil:
		return Decision{}, check("trusted node account", account, refuse(codes.PermissionDenied, "impersonation_not_enabled", denied,
			errors.New("no cluster access to authorize node proxies")), "")
	case c.PodName == "" || c.PodUID == "":
		return Decision{}, check("trusted node account", account, refuse(codes.PermissionDenied, "caller_not_pod_bound", denied,
			errors.New("node proxy token is not bound to a Pod")), "")
	}
	_ = check("trusted node account", account, nil, "trusted")
	if err := check("identity not denied", target.String(), a.denied(target), "not in the node proxy deny list"); err != nil {
		return Decision{}, err
	}
	pod, err := a.callerPod(ctx, c, check, tracing)
	if err != nil {
		return Decision{}, err
	}
	node, source := c.Node, "token's node-name extra"
	if node == "" {
		node, source = pod.Node, "caller Pod's spec.nodeName"
	}
	if node == "" {
		return Decision{}, check("caller node", pod.Namespace+"/"+pod.Name, refuse(codes.PermissionDenied, "caller_node_unknown", denied,
			fmt.Errorf("node proxy Pod %s/%s is not scheduled", pod.Namespace, pod.Name)), "")
	}
	if tracing {
		_ = check("caller node", pod.Namespace+"/"+pod.Name, nil, node+" (from the "+source+")")
	}
	if err := a.onNode(ctx, target, node, check, tracing); err != nil {
		return Decision{}, err
	}
	return Decision{ID: target, ProxyNode: node}, nil
}

// own decides a request for the caller's own identity: its Pod, when its
// token is bound to one, must be live; a renewal by certificate needs a
// live Pod of its account. A trusted node proxy's node is its token's, or
// its Pod's.
func (a *NodeAuthorizer) own(ctx context.Context, c *Caller, check func(name, input string, err error, note string) error, tracing bool) (Decision, error) {
	d := Decision{ID: c.ID}
	if c.PodName != "" && a.Pods != nil {
		pod, err := a.callerPod(ctx, c, check, tracing)
		if err != nil {
			return Decision{}, err
		}
		if a.TrustedNodeAccounts[c.Namespace+"/"+c.ServiceAccount] {
			d.ProxyNode = c.Node
			if d.ProxyNode == "" {
				d.ProxyNode = pod.Node
			}
		}
	}
	if c.Method == MethodCertificate && a.Pods != nil {
		if err := a.accountPod(ctx, c, check); err != nil {
			return Decision{}, err
		}
	}
	return d, check("identity", "own identity", nil, c.ID.String())
}

// onNode checks that a Pod of target's service account runs on node.
func (a *NodeAuthorizer) onNode(ctx context.Context, target spiffeid.ID, node string, check func(name, input string, err error, note string) error, tracing bool) error {
	const denied = "this caller may not request other identities"
	ns, sa, _ := parseWorkloadID(target)
	input := func() string { return fmt.Sprintf("%s/%s on node %s", ns, sa, node) }
	pods, err := a.Pods.OnNode(ctx, ns, sa, node)
	if err != nil {
		return check("workload on node", input(), podLookupError(err), "")
	}
	if len(pods) == 0 {
		return check("workload on node", input(), refuse(codes.PermissionDenied, "not_on_node", denied,
			fmt.Errorf("no running Pod of %s/%s on node %s", ns, sa, node)), "")
	}
	if tracing {
		_ = check("workload on node", input(), nil, fmt.Sprintf("Pod %s runs it", pods[0].Name))
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// parseTarget checks a requested workload identity.
func (a *NodeAuthorizer) parseTarget(requested string) (spiffeid.ID, error) {
	const msg = "ImpersonatedIdentity must be one SPIFFE ID spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
	if strings.ContainsAny(requested, ", \t\n") {
		return spiffeid.ID{}, refuse(codes.InvalidArgument, "malformed_identity", msg, fmt.Errorf("%q holds more than one value", requested))
	}
	id, err := spiffeid.FromString(requested)
	if err != nil {
		return spiffeid.ID{}, refuse(codes.InvalidArgument, "malformed_identity", msg, err)
	}
	if _, _, ok := parseWorkloadID(id); !ok {
		return spiffeid.ID{}, refuse(codes.InvalidArgument, "malformed_identity", msg, fmt.Errorf("%s is not a workload identity", id))
	}
	if !id.MemberOf(a.TrustDomain) {
		return spiffeid.ID{}, refuse(codes.PermissionDenied, "foreign_trust_domain",
			"requested identity is not in this CA's trust domain", fmt.Errorf("%s is not in %s", id, a.TrustDomain))
	}
	return id, nil
}

// callerPod checks that the Pod a token is bound to still exists, is the
// same Pod (UID), runs the token's service account and has not
// terminated; a Pod being deleted keeps its identity while it drains. The
// apiserver keeps accepting a deleted Pod's token for a few seconds; this
// does not.
func (a *NodeAuthorizer) callerPod(ctx context.Context, c *Caller, check func(name, input string, err error, note string) error, tracing bool) (*kube.PodInfo, error) {
	pod, err := a.lookupCallerPod(ctx, c)
	if err == nil && !tracing {
		return pod, nil
	}
	input := fmt.Sprintf("%s/%s uid %s", c.Namespace, c.PodName, c.PodUID)
	if err != nil {
		return nil, check("caller pod", input, err, "")
	}
	return pod, check("caller pod", input, nil, "exists, same UID and service account")
}

func (a *NodeAuthorizer) lookupCallerPod(ctx context.Context, c *Caller) (*kube.PodInfo, error) {
	const msg = "token is not a valid service-account token for this CA"
	pod, err := a.Pods.Pod(ctx, c.Namespace, c.PodName)
	switch {
	case err != nil:
		return nil, podLookupError(err)
	case pod == nil:
		return nil, refuse(codes.Unauthenticated, "caller_pod_missing", msg, fmt.Errorf("the token's Pod %s/%s does not exist", c.Namespace, c.PodName))
	case c.PodUID != "" && pod.UID != c.PodUID:
		return nil, refuse(codes.Unauthenticated, "caller_uid_mismatch", msg, fmt.Errorf("the token's Pod %s/%s has UID %s, the token names %s", c.Namespace, c.PodName, pod.UID, c.PodUID))
	case pod.ServiceAccount != c.ServiceAccount:
		return nil, refuse(codes.Unauthenticated, "caller_sa_mismatch", msg, fmt.Errorf("the token's Pod %s/%s runs %s, the token is for %s", c.Namespace, c.PodName, pod.ServiceAccount, c.ServiceAccount))
	case pod.Terminated:
		return nil, refuse(codes.Unauthenticated, "caller_pod_terminated", msg, fmt.Errorf("the token's Pod %s/%s has terminated", c.Namespace, c.PodName))
	}
	return pod, nil
}

// accountPod checks that a caller renewing by client certificate still
// has a live Pod of its service account in this cluster: a certificate of
// a workload that is gone must not keep itself alive.
func (a *NodeAuthorizer) accountPod(ctx context.Context, c *Caller, check func(name, input string, err error, note string) error) error {
	input := c.Namespace + "/" + c.ServiceAccount
	pods, err := a.Pods.OfAccount(ctx, c.Namespace, c.ServiceAccount)
	switch {
	case err != nil:
		return check("renewing workload", input, podLookupError(err), "")
	case len(pods) == 0:
		return check("renewing workload", input, refuse(codes.Unauthenticated, "cert_workload_gone",
			"no running Pod has this certificate's service account: authenticate with a service-account token",
			fmt.Errorf("no live Pod of %s in this cluster", input)), "")
	}
	return check("renewing workload", input, nil, fmt.Sprintf("Pod %s runs it", pods[0].Name))
}

// podLookupError is a Pod lookup that did not decide. The apiserver not
// answering before the request's deadline is Unavailable, as a refused
// connection is: the deadline is often meshca's own --request-timeout,
// not the client's, and the client must retry. A cancelled request's
// client has gone.
func podLookupError(err error) error {
	switch {
	case errors.Is(err, kube.ErrNotSynced):
		return refuse(codes.Unavailable, "pod_index_not_synced", "CA is starting, retry shortly", err)
	case errors.Is(err, context.Canceled):
		return err
	}
	var budget *kube.LookupBudgetError
	if errors.As(err, &budget) {
		return &limit.ExhaustedError{Reason: limit.ReasonNodePodLookups,
			Msg:        fmt.Sprintf("too many requests for Pods this node does not run, retry in %v", budget.RetryAfter),
			RetryAfter: budget.RetryAfter, Err: err}
	}
	return refuse(codes.Unavailable, "pod_lookup_failed", "cannot check Pods now, retry later", err)
}

// ParseNodeAccounts reads "ns/sa,ns/sa".
func ParseNodeAccounts(list []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, e := range list {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		ns, sa, ok := strings.Cut(e, "/")
		if !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
			return nil, fmt.Errorf("node account %q is not namespace/serviceaccount", e)
		}
		out[e] = true
	}
	return out, nil
}
