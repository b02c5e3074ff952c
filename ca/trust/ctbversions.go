package trust

import (
	"context"

	certv1 "k8s.io/api/certificates/v1"
	certv1alpha1 "k8s.io/api/certificates/v1alpha1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ctbResource is the ClusterTrustBundle API's resource name in discovery.
const ctbResource = "clustertrustbundles"

// ctbAPI is one version of the ClusterTrustBundle API through its typed
// client, seen as certificates/v1 objects: the versions differ in name
// only.
type ctbAPI struct {
	groupVersion string
	informer     func(informers.SharedInformerFactory) cache.SharedIndexInformer
	toV1         func(obj any) (*certv1.ClusterTrustBundle, bool)
	create       func(context.Context, kubernetes.Interface, *certv1.ClusterTrustBundle) error
	update       func(context.Context, kubernetes.Interface, *certv1.ClusterTrustBundle) error
}

// ctbAPIs are the versions meshca speaks, newest first: GA v1 (served
// by default since Kubernetes 1.37), then v1beta1 and v1alpha1, which
// older clusters serve only behind the ClusterTrustBundle feature gate
// and --runtime-config.
var ctbAPIs = []ctbAPI{
	{
		groupVersion: certv1.SchemeGroupVersion.String(),
		informer: func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Certificates().V1().ClusterTrustBundles().Informer()
		},
		toV1: func(obj any) (*certv1.ClusterTrustBundle, bool) {
			b, ok := obj.(*certv1.ClusterTrustBundle)
			return b, ok
		},
		create: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1().ClusterTrustBundles().Create(ctx, b, metav1.CreateOptions{})
			return err
		},
		update: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1().ClusterTrustBundles().Update(ctx, b, metav1.UpdateOptions{})
			return err
		},
	},
	{
		groupVersion: certv1beta1.SchemeGroupVersion.String(),
		informer: func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Certificates().V1beta1().ClusterTrustBundles().Informer()
		},
		toV1: func(obj any) (*certv1.ClusterTrustBundle, bool) {
			b, ok := obj.(*certv1beta1.ClusterTrustBundle)
			if !ok {
				return nil, false
			}
			return v1Bundle(b.ObjectMeta, b.Spec.SignerName, b.Spec.TrustBundle), true
		},
		create: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1beta1().ClusterTrustBundles().Create(ctx, &certv1beta1.ClusterTrustBundle{ObjectMeta: b.ObjectMeta,
				Spec: certv1beta1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle}}, metav1.CreateOptions{})
			return err
		},
		update: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1beta1().ClusterTrustBundles().Update(ctx, &certv1beta1.ClusterTrustBundle{ObjectMeta: b.ObjectMeta,
				Spec: certv1beta1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle}}, metav1.UpdateOptions{})
			return err
		},
	},
	{
		groupVersion: certv1alpha1.SchemeGroupVersion.String(),
		informer: func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Certificates().V1alpha1().ClusterTrustBundles().Informer()
		},
		toV1: func(obj any) (*certv1.ClusterTrustBundle, bool) {
			b, ok := obj.(*certv1alpha1.ClusterTrustBundle)
			if !ok {
				return nil, false
			}
			return v1Bundle(b.ObjectMeta, b.Spec.SignerName, b.Spec.TrustBundle), true
		},
		create: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1alpha1().ClusterTrustBundles().Create(ctx, &certv1alpha1.ClusterTrustBundle{ObjectMeta: b.ObjectMeta,
				Spec: certv1alpha1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle}}, metav1.CreateOptions{})
			return err
		},
		update: func(ctx context.Context, c kubernetes.Interface, b *certv1.ClusterTrustBundle) error {
			_, err := c.CertificatesV1alpha1().ClusterTrustBundles().Update(ctx, &certv1alpha1.ClusterTrustBundle{ObjectMeta: b.ObjectMeta,
				Spec: certv1alpha1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle}}, metav1.UpdateOptions{})
			return err
		},
	},
}

// v1Bundle is an older version's object as a v1 one; the metadata is
// copied, so the cache's object stays untouched.
func v1Bundle(meta metav1.ObjectMeta, signer, pem string) *certv1.ClusterTrustBundle {
	return &certv1.ClusterTrustBundle{ObjectMeta: *meta.DeepCopy(),
		Spec: certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: pem}}
}
