package istiodcert

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// istiod verifies the client certificates of its xDS clients with the
// roots it read when it started (pilot/pkg/bootstrap's peer certificate
// verifier is built once), whatever its files say later: a root meshca
// adds to its ca.crt is trusted only once istiod restarted. With a
// Deployment to restart, the keeper rolls it when the roots grow, by the
// pod template annotation AnnotationTrustedRoots, as `kubectl rollout
// restart` does; the rotation guards read the annotation and the
// rollout's state (Read).
const (
	// AnnotationTrustedRoots, on the Deployment's pod template, lists the
	// SHA-256 fingerprints of the roots its Pods start with, comma
	// separated, sorted.
	AnnotationTrustedRoots = "meshca.io/trusted-roots"
	// AnnotationDeployment, on the Secret, names the Deployment the keeper
	// restarts, for the guards of `meshca root`.
	AnnotationDeployment = "meshca.io/istiod-deployment"
)

// fingerprints are roots' SHA-256 fingerprints, sorted.
func fingerprints(roots []*x509.Certificate) []string {
	out := make([]string, 0, len(roots))
	for _, r := range roots {
		out = append(out, keymgr.Fingerprint(r))
	}
	slices.Sort(out)
	return out
}

// parseRoots reads AnnotationTrustedRoots.
func parseRoots(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// restart rolls the Deployment when its Pods started without a root of
// bundle, once what they will read holds it: the Secret (written), and
// istio-ca-root-cert in its namespace, which istiod reads first when it is
// there. It reports whether it restarted it, and why it waits.
func (k *Keeper) restart(ctx context.Context, bundle []*x509.Certificate) (bool, string, error) {
	deployments := k.c.Client.AppsV1().Deployments(k.c.Namespace)
	d, err := deployments.Get(ctx, k.c.Deployment, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("istiodcert: reading Deployment %s/%s: %w", k.c.Namespace, k.c.Deployment, err)
	}
	want := fingerprints(bundle)
	have := parseRoots(d.Spec.Template.Annotations[AnnotationTrustedRoots])
	missing := false
	for _, fp := range want {
		missing = missing || !slices.Contains(have, fp)
	}
	if !missing {
		return false, "", nil
	}
	cm, err := k.c.Client.CoreV1().ConfigMaps(k.c.Namespace).Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, "", fmt.Errorf("istiodcert: reading %s/%s: %w", k.c.Namespace, trust.ConfigMapName, err)
	default:
		if roots, _ := pemutil.ParseCertificates([]byte(cm.Data[trust.DataKey])); !sameCerts(roots, bundle) {
			return false, "istio-ca-root-cert in istiod's namespace does not hold the bundle yet", nil
		}
	}
	if _, err := deployments.Patch(ctx, k.c.Deployment, types.StrategicMergePatchType, RestartPatch(want), metav1.PatchOptions{}); err != nil {
		return false, "", fmt.Errorf("istiodcert: restarting Deployment %s/%s: %w", k.c.Namespace, k.c.Deployment, err)
	}
	return true, "", nil
}

// RestartPatch is the strategic merge patch that restarts istiod's
// Deployment to load the roots of fingerprints (sorted): it sets the pod
// template annotation AnnotationTrustedRoots, and nothing else, which is
// all the admission policy of meshca's chart lets meshca's account change.
func RestartPatch(fingerprints []string) []byte {
	return templateAnnotationPatch(AnnotationTrustedRoots, strings.Join(fingerprints, ","))
}

// templateAnnotationPatch is a strategic merge patch setting the pod
// template annotation key to value.
func templateAnnotationPatch(key, value string) []byte {
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{key: value}}}}})
	return patch
}

// probeAnnotation is the pod template annotation probeRestartGuard asks,
// in a dry run, to add.
const probeAnnotation = "meshca.io/restart-guard-probe"

// probeRestartGuard asks the apiserver, in a dry run that changes nothing,
// to add another pod template annotation to istiod's Deployment than
// AnnotationTrustedRoots, and logs what it answered: an admission policy
// (the ValidatingAdmissionPolicy meshca's chart ships) refusing it is the
// guard that keeps the patch the restart needs from changing what istiod
// runs; a dry run that passes means this account could run any code as
// istiod's service account.
func (k *Keeper) probeRestartGuard(ctx context.Context) {
	if k.c.Deployment == "" {
		return
	}
	_, err := k.c.Client.AppsV1().Deployments(k.c.Namespace).Patch(ctx, k.c.Deployment, types.StrategicMergePatchType,
		templateAnnotationPatch(probeAnnotation, "x"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	dep := k.c.Namespace + "/" + k.c.Deployment
	switch {
	case err == nil:
		k.c.Logger.WarnContext(ctx, "istiod's Deployment takes any change from this account, not only the restart annotation: "+
			"install the ValidatingAdmissionPolicy meshca's chart renders with istio.enabled (docs/istio.md), or restart istiod yourself",
			"deployment", dep)
	case strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
		k.c.Logger.InfoContext(ctx, "istiod's Deployment is guarded: an admission policy lets this account change its restart annotation alone",
			"deployment", dep)
	default:
		k.c.Logger.DebugContext(ctx, "istiod's Deployment: the restart guard could not be probed", "deployment", dep, "error", err)
	}
}

// readRestart fills d's Restarter, Loaded and Restarting from the
// Deployment name: the roots its Pods start with, and whether a rollout
// is under way.
func readRestart(ctx context.Context, client kubernetes.Interface, namespace, name string, d *keymgr.Dependent) {
	d.Restarter = "Deployment " + namespace + "/" + name
	dep, err := client.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		d.Err = fmt.Errorf("reading %s: %w", d.Restarter, err)
		return
	}
	d.Loaded = parseRoots(dep.Spec.Template.Annotations[AnnotationTrustedRoots])
	d.Restarting = !rolledOut(dep)
}

// rolledOut reports whether every replica of d runs its current template,
// as `kubectl rollout status` judges it.
func rolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want
}
