package ca

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/util/validation"
)

// DenyList is the identities no node proxy may receive for another,
// whatever runs on its node: the operator's entries (--node-proxy-deny,
// ParseNodeProxyDeny) and the CA's own accounts (WithOwn), which no entry
// can lift. The zero value and nil deny nothing. It is not changed once
// built, and is safe for concurrent use.
type DenyList struct {
	// exact holds "namespace" and "namespace/serviceaccount" entries.
	exact map[string]bool
	// prefixes are "namespace/prefix*" entries.
	prefixes []denyPrefix
	// own are the CA's own "namespace/serviceaccount" accounts.
	own map[string]bool
}

// denyPrefix is an entry "ns/prefix*".
type denyPrefix struct{ ns, prefix string }

func (p denyPrefix) String() string { return p.ns + "/" + p.prefix + "*" }

// DefaultNodeProxyDeny is --node-proxy-deny's default: kube-system, whose
// Pods run on every node and which Istio's CNI keeps out of the mesh,
// and istiod's account in Istio's default namespace, of any revision
// (istiod, istiod-<revision>: istiod-canary, istiod-1-24-0). A node
// proxy never serves either: istiod and kube-system's components request
// their own certificates, if any.
func DefaultNodeProxyDeny() []string {
	return []string{"kube-system", "istio-system/istiod", "istio-system/istiod-*"}
}

// reasonDeniedIdentity is the refusal of an identity in a DenyList.
const reasonDeniedIdentity = "impersonation_denied_identity"

// ParseNodeProxyDeny reads --node-proxy-deny's entries: a namespace
// ("kube-system") denies all its service accounts, "namespace/account"
// one, and "namespace/prefix*" every account of the namespace whose name
// starts with prefix ("istio-system/istiod-*": each revision's istiod).
// Empty entries are skipped.
func ParseNodeProxyDeny(list []string) (*DenyList, error) {
	d := &DenyList{exact: map[string]bool{}}
	for _, e := range list {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		ns, sa, hasSA := strings.Cut(e, "/")
		prefix, isPrefix := strings.CutSuffix(sa, "*")
		switch {
		case len(validation.IsDNS1123Label(ns)) > 0:
			return nil, fmt.Errorf("entry %q is neither a namespace nor namespace/serviceaccount (nor namespace/prefix*)", e)
		case isPrefix && prefix == "":
			return nil, fmt.Errorf("entry %q: a namespace alone, %q, denies every account of it", e, ns)
		case isPrefix && len(validation.IsDNS1123Subdomain(prefix+"a")) > 0:
			return nil, fmt.Errorf("entry %q: %q does not begin a service account's name (lower-case letters, digits, '-' and '.'; one '*', at the end)", e, prefix)
		case isPrefix:
			d.prefixes = append(d.prefixes, denyPrefix{ns: ns, prefix: prefix})
		case hasSA && len(validation.IsDNS1123Subdomain(sa)) > 0:
			return nil, fmt.Errorf("entry %q is neither a namespace nor namespace/serviceaccount (nor namespace/prefix*)", e)
		default:
			d.exact[e] = true
		}
	}
	return d, nil
}

// WithOwn is d that also denies the CA's own account ns/sa: the service
// account meshca runs as, or the SPIFFE ID of its bundle endpoint. Its
// refusal says so.
func (d *DenyList) WithOwn(ns, sa string) (*DenyList, error) {
	if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(sa)) > 0 {
		return nil, fmt.Errorf("the CA's own account %q is not namespace/serviceaccount", ns+"/"+sa)
	}
	out := &DenyList{own: map[string]bool{ns + "/" + sa: true}}
	if d != nil {
		out.exact, out.prefixes = d.exact, d.prefixes
		for a := range d.own {
			out.own[a] = true
		}
	}
	return out, nil
}

// Entries are the operator's entries, sorted.
func (d *DenyList) Entries() []string {
	if d == nil {
		return nil
	}
	out := make([]string, 0, len(d.exact)+len(d.prefixes))
	for e := range d.exact {
		out = append(out, e)
	}
	for _, p := range d.prefixes {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// Own are the CA's own accounts, sorted.
func (d *DenyList) Own() []string {
	if d == nil {
		return nil
	}
	return keys(d.own)
}

// match returns what denies ns/sa: the operator's entry, or the CA's own
// account (own); ok is false when nothing does. Of several prefixes the
// longest is named.
func (d *DenyList) match(ns, sa string) (entry string, own, ok bool) {
	if d == nil {
		return "", false, false
	}
	account := ns + "/" + sa
	switch {
	case d.own[account]:
		return account, true, true
	case d.exact[account]:
		return account, false, true
	case d.exact[ns]:
		return ns, false, true
	}
	var best *denyPrefix
	for i, p := range d.prefixes {
		if p.ns == ns && strings.HasPrefix(sa, p.prefix) && (best == nil || len(p.prefix) > len(best.prefix)) {
			best = &d.prefixes[i]
		}
	}
	if best == nil {
		return "", false, false
	}
	return best.String(), false, true
}

// denied refuses a target the deny list names. It is checked before the
// Pods are, so that no lookup is spent on an identity no Pod can earn.
func (a *NodeAuthorizer) denied(target spiffeid.ID) error {
	ns, sa, _ := parseWorkloadID(target)
	entry, own, ok := a.NodeProxyDeny.match(ns, sa)
	switch {
	case !ok:
		return nil
	case own:
		return refuse(codes.PermissionDenied, reasonDeniedIdentity,
			fmt.Sprintf("node proxies may not request %s: it is this CA's own identity", target),
			fmt.Errorf("%s is the CA's own account %s", target, entry))
	}
	return refuse(codes.PermissionDenied, reasonDeniedIdentity,
		fmt.Sprintf("node proxies may not request %s: the CA's --node-proxy-deny lists %s; its workload must request its own certificate with its own token", target, entry),
		fmt.Errorf("%s is denied to node proxies by the entry %q", target, entry))
}
