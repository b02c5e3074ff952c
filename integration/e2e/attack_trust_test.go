package e2e

import (
	"context"
	"encoding/pem"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/testca"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trustSurface: the trust publisher of the arena's meshca
// (--publish-root-cert-configmaps) and the tenants who may edit the
// istio-ca-root-cert ConfigMap of their namespaces. Whatever a tenant
// writes there (another root, a root beside meshca's, no Istio label,
// no ConfigMap, the published version's annotations, padding), meshca
// puts its bundle back, and believes only the record on its Lease,
// which tenants may not write. The selector keeps it to the namespaces
// made here. The arena's pod certificate signer shares the Lease
// namespace.
type trustSurface struct {
	flags   []string
	control string
	// tenants are a namespace per row, published to from the start.
	tenants map[string]string
	forged  string // a root of an attacker's CA, PEM
}

func newTrustSurface(t *testing.T) *trustSurface {
	lbls, sel := runLabel(t)
	s := &trustSurface{control: trustNamespace(t, "attack-trust", lbls), tenants: map[string]string{},
		forged: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: testca.NewRoot(t, "cluster.local", testca.Options{}).Cert.Raw}))}
	for _, row := range []string{"forged", "beside", "label", "deleted", "annotations", "padded"} {
		s.tenants[row] = trustNamespace(t, "attack-trust-"+row, lbls)
	}
	s.flags = []string{"--publish-root-cert-configmaps", "--trust-lease-namespace", cluster.Namespace(t, "attack-lease"),
		"--trust-namespace-selector", sel.String()}
	return s
}

func (s *trustSurface) checks(_ *testing.T, a *arena) []check {
	tamper := func(name, row, defence, result string, edit func(cm *corev1.ConfigMap) bool, done func(cm, control *corev1.ConfigMap) bool) check {
		return check{name: "trust/" + name, defence: "trust:" + defence, run: func(t *testing.T) {
			s.tamper(t, a, s.tenants[row], result, edit, done)
		}}
	}
	same := func(cm, control *corev1.ConfigMap) bool { return holdsBundle(cm, control.Data[trust.DataKey]) }
	return []check{
		tamper("a tenant's forged root", "forged", "forged_root_repaired", trust.ResultUpdated,
			func(cm *corev1.ConfigMap) bool { cm.Data[trust.DataKey] = s.forged; return true }, same),
		tamper("a tenant's root beside meshca's", "beside", "forged_root_repaired", trust.ResultUpdated,
			func(cm *corev1.ConfigMap) bool { cm.Data[trust.DataKey] += s.forged; return true }, same),
		tamper("the Istio label removed", "label", "label_restored", trust.ResultUpdated,
			func(cm *corev1.ConfigMap) bool { delete(cm.Labels, trust.LabelKey); return true }, same),
		tamper("the ConfigMap deleted", "deleted", "configmap_recreated", trust.ResultCreated,
			func(*corev1.ConfigMap) bool { return false }, same),
		// The annotations are for people: meshca writes the version it
		// published over a tenant's, and believes only its Lease.
		tamper("a forged version on the ConfigMap", "annotations", "configmap_version_ignored", trust.ResultUpdated,
			func(cm *corev1.ConfigMap) bool {
				cm.Annotations[trust.AnnotationLineage], cm.Annotations[trust.AnnotationSequence] = "forged", "18446744073709551615"
				return true
			}, func(cm, control *corev1.ConfigMap) bool {
				return same(cm, control) && cm.Annotations[trust.AnnotationLineage] == control.Annotations[trust.AnnotationLineage] &&
					cm.Annotations[trust.AnnotationSequence] == control.Annotations[trust.AnnotationSequence]
			}),
		// Padded to a ConfigMap's 1 MiB: meshca keeps of it only what it
		// compares, and rewrites it to hold its bundle alone.
		tamper("a ConfigMap padded to 1 MiB with a forged root", "padded", "padded_configmap_rewritten", trust.ResultUpdated,
			func(cm *corev1.ConfigMap) bool {
				cm.Data[trust.DataKey], cm.Data["padding"] = s.forged, strings.Repeat("x", 1<<20-16<<10)
				return true
			}, func(cm, control *corev1.ConfigMap) bool {
				return same(cm, control) && len(cm.Data) == 1 && len(cm.BinaryData) == 0
			}),
	}
}

// tamper waits for ns's ConfigMap, edits it (edit false: deletes it), and
// waits for meshca to write it back as done says, counted as result.
func (s *trustSurface) tamper(t *testing.T, a *arena, ns, result string, edit func(cm *corev1.ConfigMap) bool,
	done func(cm, control *corev1.ConfigMap) bool) {
	ctx := context.Background()
	control := waitConfigMap(t, s.control)
	waitBundle(t, ns, "", 30*time.Second)
	writes := func() float64 {
		v, _ := scrapeMetrics(t, a.s.AdminAddr).value("meshca_trust_writes_total", map[string]string{"kind": "configmap", "document": "bundle", "result": result})
		return v
	}
	before := writes()
	cms := cluster.Client.CoreV1().ConfigMaps(ns)
	cm := waitConfigMap(t, ns)
	if edit(cm) {
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err := cms.Delete(ctx, trust.ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for deadline := start.Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// Written back as a new object when deleted, and counted.
		got := rootConfigMap(t, ns)
		if got != nil && done(got, control) && got.UID != "" && (got.UID != cm.UID) == (result == trust.ResultCreated) && writes() > before {
			break
		}
		if time.Now().After(deadline) {
			if got != nil {
				got.Data = map[string]string{trust.DataKey: got.Data[trust.DataKey], "(keys)": strconv.Itoa(len(got.Data))}
			}
			t.Fatalf("not written back within 10s, or meshca_trust_writes_total{kind=configmap,result=%s} still %v: %+v", result, writes(), got)
		}
	}
	t.Logf("written back after %v", time.Since(start).Round(time.Millisecond))
}

// leaseChecks: the record on the trust publisher's Lease decides what a
// replica may publish. One naming a newer bundle of the replica's own CA
// state, or a bundle of another CA state, keeps it from writing its own
// over what is published: it says why, counts the write as stale, and
// leaves the ConfigMaps alone. (An operator removes the record to
// publish an older or another state's bundle on purpose:
// docs/rotation.md.) Each row runs a meshca of its own, with a Lease of
// its own.
func leaseChecks(_ *testing.T) []check {
	return []check{
		{name: "trust/a newer sequence recorded on the Lease", defence: "trust:lease_newer_sequence", run: func(t *testing.T) {
			forgeLease(t, "newer than this replica's CA state", func(l *coordv1.Lease) {
				seq, _ := strconv.ParseUint(l.Annotations[trust.AnnotationSequence], 10, 64)
				l.Annotations[trust.AnnotationSequence] = strconv.FormatUint(seq+1000, 10)
			})
		}},
		{name: "trust/another CA state recorded on the Lease", defence: "trust:lease_other_lineage", run: func(t *testing.T) {
			forgeLease(t, "belongs to another CA state", func(l *coordv1.Lease) {
				l.Annotations[trust.AnnotationLineage] = "forged-lineage"
			})
		}},
	}
}

// forgeLease runs a meshca until it published, stops it, edits the
// record on its Lease and what its namespace holds (as a newer replica
// would have published), and starts it again on the same CA state: it
// must log why and leave the ConfigMap as it is.
func forgeLease(t *testing.T, why string, edit func(*coordv1.Lease)) {
	ctx := context.Background()
	lbls, sel := runLabel(t)
	lease, apps := cluster.Namespace(t, "attack-lease"), trustNamespace(t, "attack-lease-apps", lbls)
	publish := []string{"--publish-root-cert-configmaps", "--trust-lease-namespace", lease, "--trust-namespace-selector", sel.String()}
	first := startServer(t, publish...)
	waitBundle(t, apps, "", 30*time.Second)
	first.Stop() // a graceful stop releases the Lease at once
	leases := cluster.Client.CoordinationV1().Leases(lease)
	l, err := leases.Get(ctx, "meshca-trust-publisher", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Annotations[trust.AnnotationLineage] == "" {
		t.Fatalf("the Lease holds no record: %v", l.Annotations)
	}
	edit(l)
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := waitConfigMap(t, apps)
	published := "published by a replica of the recorded state\n"
	cm.Data[trust.DataKey] = published
	if _, err := cluster.Client.CoreV1().ConfigMaps(apps).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	again := harness.StartMeshca(t, bin, append([]string{"--state-dir", first.stateDir, "--kubeconfig", cluster.Kubeconfig}, publish...)...)
	if !again.WaitForLog(20*time.Second, why) {
		t.Fatalf("meshca did not say %q", why)
	}
	time.Sleep(500 * time.Millisecond)
	if got := waitConfigMap(t, apps).Data[trust.DataKey]; got != published {
		t.Errorf("meshca wrote over the published bundle: %.60q", got)
	}
	if v, _ := scrapeMetrics(t, again.AdminAddr).value("meshca_trust_writes_total",
		map[string]string{"kind": "configmap", "document": "bundle", "result": trust.ResultStale}); v < 1 {
		t.Errorf("meshca_trust_writes_total{kind=configmap,result=stale} = %v, want at least 1", v)
	}
}
