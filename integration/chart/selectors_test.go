package chart

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// checkPodSelectors: the selectors of meshca's Deployment, Service and
// PodDisruptionBudget match the Deployment's Pods and no other Pod the
// chart makes. A rotation Job's Pod they matched would make the budget's
// maxUnavailable need the scale of a Job, which has none: the disruption
// controller then allows no eviction, and every node drain waits.
func checkPodSelectors(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	d := deployment(t, objs)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		t.Fatalf("Deployment selector: %v", err)
	}
	selectors := map[string]labels.Selector{"Deployment " + d.Name: sel}
	for _, o := range objs {
		switch o.GetKind() {
		case "PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			convert(t, o, &p)
			if sel, err = metav1.LabelSelectorAsSelector(p.Spec.Selector); err != nil {
				t.Fatalf("PodDisruptionBudget selector: %v", err)
			}
			selectors["PodDisruptionBudget "+o.GetName()] = sel
		case "Service":
			var s corev1.Service
			convert(t, o, &s)
			selectors["Service "+s.Name] = labels.SelectorFromSet(s.Spec.Selector)
		}
	}
	pods := map[string]map[string]string{}
	for _, o := range objs {
		switch o.GetKind() {
		case "CronJob":
			var c batchv1.CronJob
			convert(t, o, &c)
			pods["CronJob "+c.Name] = c.Spec.JobTemplate.Spec.Template.Labels
		case "Job":
			var j batchv1.Job
			convert(t, o, &j)
			pods["Job "+j.Name] = j.Spec.Template.Labels
		case "Pod":
			pods["Pod "+o.GetName()] = o.GetLabels()
		case "StatefulSet", "DaemonSet", "ReplicaSet":
			l, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			pods[o.GetKind()+" "+o.GetName()] = l
		}
	}
	for what, sel := range selectors {
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s selector %s does not match the Deployment's Pods %v", what, sel, d.Spec.Template.Labels)
		}
		for owner, l := range pods {
			if sel.Matches(labels.Set(l)) {
				t.Errorf("%s selector %s matches the Pods of %s %v: only meshca's Deployment's may carry it", what, sel, owner, l)
			}
		}
	}
}
