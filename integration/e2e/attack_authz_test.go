package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Messages of authorization refusals.
const (
	deniedMsg    = "this caller may not request other identities"
	malformedMsg = "ImpersonatedIdentity must be one SPIFFE ID spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
	notStringMsg = "ImpersonatedIdentity must be one SPIFFE ID string"
)

// impersonationAttacks: node-proxy requests for identities the caller may
// not have. README: PermissionDenied for an untrusted caller, a workload
// not on the caller's node or a foreign trust domain; InvalidArgument for
// a malformed ImpersonatedIdentity; Unauthenticated when the caller's own
// Pod is not live.
func (a *arena) impersonationAttacks(t *testing.T) []attack {
	apps, sys := a.apps, a.system
	cluster.NewWorkload(t, apps, "db", "node-b")
	nosy := cluster.NewWorkload(t, apps, "nosy", "node-a")
	fake := cluster.NewWorkload(t, apps, "ztunnel", "node-a") // ztunnel's name, the wrong namespace
	for sa, phase := range map[string]corev1.PodPhase{"batch": corev1.PodFailed, "finished": corev1.PodSucceeded} {
		cluster.ServiceAccount(t, apps, sa)
		setPhase(t, cluster.Pod(t, apps, sa+"-0", sa, "node-a"), phase)
	}
	cluster.ServiceAccount(t, apps, "pending")
	cluster.Pod(t, apps, "pending-0", "pending", "") // not scheduled yet
	unbound := cluster.Token(t, sys, "ztunnel", "", []string{"istio-ca"}, time.Hour)
	cluster.Pod(t, sys, "ztunnel-failed", "ztunnel", "node-a")
	failedZ := cluster.Token(t, sys, "ztunnel", "ztunnel-failed", []string{"istio-ca"}, time.Hour)
	setPhase(t, getPod(t, sys, "ztunnel-failed"), corev1.PodFailed)
	cluster.Pod(t, sys, "ztunnel-unscheduled", "ztunnel", "")
	unscheduledZ := cluster.Token(t, sys, "ztunnel", "ztunnel-unscheduled", []string{"istio-ca"}, time.Hour)
	a.secret(nosy.Token, fake.Token, unbound, failedZ, unscheduledZ)
	// Issue 22: the control plane's Pods on ztunnel's node. Their
	// identities are denied to node proxies (--node-proxy-deny).
	istiod := cluster.NewWorkload(t, sys, "istiod", "node-a")
	a.secret(istiod.Token)
	kubeSA := "dns-" + strings.TrimPrefix(apps, "apps-")
	cluster.ServiceAccount(t, "kube-system", kubeSA)
	cluster.Pod(t, "kube-system", kubeSA+"-0", kubeSA, "node-a")
	t.Cleanup(func() {
		_ = cluster.Client.CoreV1().Pods("kube-system").Delete(context.Background(), kubeSA+"-0", metav1.DeleteOptions{})
		_ = cluster.Client.CoreV1().ServiceAccounts("kube-system").Delete(context.Background(), kubeSA, metav1.DeleteOptions{})
	})

	z, web := a.ztunnelA.Token, a.webID.String()
	base := "spiffe://cluster.local/ns/" + apps + "/sa/"
	const PD, IA = codes.PermissionDenied, codes.InvalidArgument
	malformed := func(name, id string) attack {
		return attack{name: "impersonation/" + name, do: a.impersonating(t, z, id), code: IA, msg: malformedMsg, reason: "malformed_identity"}
	}
	return []attack{
		{name: "impersonation/untrusted caller", do: a.impersonating(t, nosy.Token, web), code: PD, msg: deniedMsg, reason: "untrusted_caller"},
		{name: "impersonation/ztunnel's name in another namespace", do: a.impersonating(t, fake.Token, web), code: PD, msg: deniedMsg,
			reason: "untrusted_caller"},
		{name: "impersonation/workload on another node", do: a.impersonating(t, z, a.id("db").String()), code: PD, msg: deniedMsg, reason: "not_on_node"},
		{name: "impersonation/Failed Pod", do: a.impersonating(t, z, a.id("batch").String()), code: PD, msg: deniedMsg, reason: "not_on_node"},
		{name: "impersonation/Succeeded Pod", do: a.impersonating(t, z, a.id("finished").String()), code: PD, msg: deniedMsg, reason: "not_on_node"},
		{name: "impersonation/Pod not yet scheduled", do: a.impersonating(t, z, a.id("pending").String()), code: PD, msg: deniedMsg,
			reason: "not_on_node"},
		{name: "impersonation/no such service account", do: a.impersonating(t, z, a.id("ghost").String()), code: PD, msg: deniedMsg,
			reason: "not_on_node"},
		{name: "impersonation/istiod's account, its Pod on the node", do: a.impersonating(t, z, "spiffe://cluster.local/ns/"+sys+"/sa/istiod"), code: PD,
			msg:    "node proxies may not request spiffe://cluster.local/ns/" + sys + "/sa/istiod: the CA's --node-proxy-deny lists " + sys + "/istiod",
			reason: "impersonation_denied_identity"},
		{name: "impersonation/kube-system, its Pod on the node", do: a.impersonating(t, z, "spiffe://cluster.local/ns/kube-system/sa/"+kubeSA), code: PD,
			msg:    "the CA's --node-proxy-deny lists kube-system; its workload must request its own certificate with its own token",
			reason: "impersonation_denied_identity"},
		{name: "impersonation/foreign trust domain", do: a.impersonating(t, z, "spiffe://evil.example/ns/"+apps+"/sa/web"), code: PD,
			msg: "requested identity is not in this CA's trust domain", reason: "foreign_trust_domain"},
		{name: "impersonation/node proxy token not bound to a Pod", do: a.impersonating(t, unbound, web), code: PD, msg: deniedMsg,
			reason: "caller_not_pod_bound"},
		{name: "impersonation/node proxy Pod not yet scheduled", do: a.impersonating(t, unscheduledZ, web), code: PD, msg: deniedMsg,
			reason: "caller_node_unknown"},
		{name: "impersonation/node proxy Pod Failed", do: a.impersonating(t, failedZ, web), code: codes.Unauthenticated, msg: tokenMsg,
			reason: "caller_pod_terminated"},
		malformed("path traversal", base+"../../"+sys+"/sa/ztunnel"),
		malformed("dot segment", base+"./web"),
		malformed("extra segments", base+"web/extra"),
		malformed("missing segments", "spiffe://cluster.local/ns/"+apps),
		malformed("trailing slash", base+"web/"),
		malformed("empty service account", base),
		malformed("percent-encoded letter", base+"w%65b"),
		malformed("percent-encoded slashes", "spiffe://cluster.local/ns/"+apps+"%2Fsa%2Fweb"),
		malformed("two IDs, comma", web+","+a.id("db").String()),
		malformed("two IDs, space", web+" "+a.id("db").String()),
		malformed("two IDs, newline", web+"\n"+a.id("db").String()),
		malformed("port in the trust domain", "spiffe://cluster.local:443/ns/"+apps+"/sa/web"),
		malformed("user info in the trust domain", "spiffe://admin@cluster.local/ns/"+apps+"/sa/web"),
		malformed("upper-case scheme", "SPIFFE://cluster.local/ns/"+apps+"/sa/web"),
		malformed("https scheme", "https://cluster.local/ns/"+apps+"/sa/web"),
		malformed("query", web+"?sa=admin"),
		malformed("fragment", web+"#admin"),
		malformed("NUL byte", web+"\x00admin"),
		malformed("homoglyph", base+"w\u0435b"), // Cyrillic е
		// The caller asks for itself in the metadata but for the victim in
		// the CSR: the CSR check still binds it to its own identity.
		{name: "impersonation/self in metadata, victim in CSR", code: IA, msg: "may only receive " + a.ztunnelID(), reason: "csr_identity_mismatch",
			do: a.do(probe{token: z, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID),
				Metadata: meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(a.ztunnelID()))}})},
	}
}

func (a *arena) ztunnelID() string {
	return "spiffe://cluster.local/ns/" + a.system + "/sa/ztunnel"
}

func setPhase(t *testing.T, p *corev1.Pod, phase corev1.PodPhase) {
	t.Helper()
	p.Status.Phase = phase
	if _, err := cluster.Client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func getPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := cluster.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// metadataAttacks: the request's metadata struct as an attacker shapes
// it. A non-string or nested ImpersonatedIdentity is InvalidArgument; an
// unknown key is ignored (wire contract: CA_HEADER_* and fields meshca
// does not know must not fail a request), so a key that only resembles
// ImpersonatedIdentity changes nothing: the CSR for the victim is then
// refused as a CSR for another identity. A request over the 64 KiB message
// limit is refused by gRPC with ResourceExhausted, as issue 11's limits
// item asks of every limit.
func (a *arena) metadataAttacks(t *testing.T) []attack {
	z, web := a.ztunnelA.Token, a.webID.String()
	csrPEM := newCSR(t, a.webID)
	with := func(token string, m *structpb.Struct) func(context.Context) (*authpb.IstioCertificateResponse, error) {
		return a.do(probe{token: token, req: &authpb.IstioCertificateRequest{Csr: csrPEM, ValidityDuration: 86400, Metadata: m}})
	}
	notString := func(name string, v *structpb.Value) attack {
		return attack{name: "metadata/ImpersonatedIdentity " + name, do: with(z, meta(authpb.MetaImpersonatedIdentity, v)),
			code: codes.InvalidArgument, msg: notStringMsg, reason: "malformed_identity"}
	}
	lookalike := func(name, key string) attack {
		return attack{name: "metadata/" + name, do: with(z, meta(key, structpb.NewStringValue(web))), code: codes.InvalidArgument,
			msg: "may only receive " + a.ztunnelID(), reason: "csr_identity_mismatch"}
	}
	huge := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range 1000 {
		huge.Fields[fmt.Sprintf("key-%04d", i)] = structpb.NewStringValue(strings.Repeat("x", 80))
	}
	list, _ := structpb.NewList([]any{web, web})
	return []attack{
		{name: "metadata/huge struct (90 KB)", do: with(z, huge), transport: true, code: codes.ResourceExhausted, msg: "larger than max"},
		notString("a number", structpb.NewNumberValue(1)),
		notString("a bool", structpb.NewBoolValue(true)),
		notString("null", structpb.NewNullValue()),
		notString("a list of two IDs", structpb.NewListValue(list)),
		notString("nested in a struct", structpb.NewStructValue(meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(web)))),
		lookalike("lower-case key", "impersonatedidentity"),
		lookalike("key with a trailing space", authpb.MetaImpersonatedIdentity+" "),
		lookalike("key with a zero-width space", "Impersonated\u200bIdentity"),
		// A CertSigner naming a signer meshca was not told it serves is
		// refused, never answered silently by the one backend.
		{name: "metadata/CertSigner naming another signer", code: codes.InvalidArgument,
			do:  with(a.web.Token, meta("CertSigner", structpb.NewStringValue("kubernetes.io/kube-apiserver-client"))),
			msg: "names a signer this CA does not serve", reason: "unknown_cert_signer"},
		{name: "metadata/CertSigner not a string", code: codes.InvalidArgument,
			do:  with(a.web.Token, meta("CertSigner", structpb.NewNumberValue(1))),
			msg: "CertSigner must be a string", reason: "malformed_cert_signer"},
		// An empty ImpersonatedIdentity asks for the caller's own identity,
		// which the victim's CSR is not.
		{name: "metadata/empty ImpersonatedIdentity", code: codes.InvalidArgument,
			do:  with(z, meta(authpb.MetaImpersonatedIdentity, structpb.NewStringValue(""))),
			msg: "may only receive " + a.ztunnelID(), reason: "csr_identity_mismatch"},
	}
}

// nested returns a value of depth levels of lists in lists.
func nested(depth int) *structpb.Value {
	v := structpb.NewStringValue("bottom")
	for range depth {
		v = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{v}})
	}
	return v
}

// newOwnDenyArena is a meshca of its own run as the chart's service
// account, istio-system/meshca, with deploy/manifests' RBAC, and WITHOUT
// --node-proxy-deny: what it denies node proxies is the binary's own
// default and the account it learns from its credentials.
func newOwnDenyArena(t *testing.T) *arena {
	data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "deploy", "manifests", "meshca.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, data)
	system := cluster.Namespace(t, "istio-system")
	m := &mesh{apps: cluster.Namespace(t, "apps"), system: system}
	m.s = startServerAs(t, cluster.ServiceAccountKubeconfig(t, "istio-system", "meshca"), "--trusted-node-accounts", system+"/ztunnel")
	m.ztunnelA = cluster.NewWorkload(t, system, "ztunnel", "node-a")
	a := &arena{mesh: m, roots: m.s.roots}
	a.web, a.webID = cluster.NewWorkload(t, m.apps, "web", "node-a"), m.id("web")
	a.secret(a.web.Token, m.ztunnelA.Token)
	return a
}

// ownIdentityAttacks (issue 28, item 7): a ztunnel asks for a revisioned
// istiod's identity and for meshca's own, each with a Pod on its node in
// istio-system; meshca, given no --node-proxy-deny, refuses both.
func (a *arena) ownIdentityAttacks(t *testing.T) []attack {
	const ns = "istio-system"
	canary := "istiod-canary-" + strings.TrimPrefix(a.apps, "apps-")
	pods := []string{canary + "-0", "meshca-" + strings.TrimPrefix(a.apps, "apps-")}
	cluster.ServiceAccount(t, ns, canary)
	cluster.Pod(t, ns, pods[0], canary, "node-a")
	cluster.Pod(t, ns, pods[1], "meshca", "node-a")
	t.Cleanup(func() {
		for _, p := range pods {
			_ = cluster.Client.CoreV1().Pods(ns).Delete(context.Background(), p, metav1.DeleteOptions{})
		}
		_ = cluster.Client.CoreV1().ServiceAccounts(ns).Delete(context.Background(), canary, metav1.DeleteOptions{})
	})
	z, td := a.ztunnelA.Token, "spiffe://cluster.local/ns/"+ns+"/sa/"
	return []attack{
		{name: "impersonation/a revisioned istiod, its Pod on the node, no --node-proxy-deny", do: a.impersonating(t, z, td+canary),
			code: codes.PermissionDenied, msg: "the CA's --node-proxy-deny lists istio-system/istiod-*",
			reason: "impersonation_denied_identity", defence: "authz:default_deny_istiod_revisions"},
		{name: "impersonation/meshca's own account, its Pod on the node, no --node-proxy-deny", do: a.impersonating(t, z, td+"meshca"),
			code: codes.PermissionDenied, msg: "node proxies may not request " + td + "meshca: it is this CA's own identity",
			reason: "impersonation_denied_identity", defence: "authz:own_identity"},
	}
}
