// Package kuberest reaches the Kubernetes API server through client-go's
// rest.RESTClient with a scheme that holds only the API types its caller
// names, instead of through k8s.io/client-go/kubernetes. The typed
// clientset registers every API group in its scheme and links the apply
// configurations, structured-merge-diff and the discovery client's OpenAPI
// models: their package initialisers cost every process that links them
// (the natgw binary, started once per gateway) tens of milliseconds of CPU
// whether it talks to the API server or not. A binary that needs a Lease or
// a Pod links this package and k8s.io/api's packages of those types only.
//
// Errors are client-go's own (*apierrors.StatusError when the API server
// answers with a Status), so apierrors.IsNotFound, IsConflict and
// IsAlreadyExists work on them.
package kuberest

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// ForGroupVersion returns a RESTClient of rc's API server for gv (path /api
// for the core group, /apis otherwise) whose codec knows the types
// addToScheme registers (a k8s.io/api package's AddToScheme, which also
// registers metav1's Status and options). rc is copied; its QPS, Burst and
// RateLimiter apply as they do for a clientset; an empty UserAgent becomes
// client-go's default.
func ForGroupVersion(rc *rest.Config, gv schema.GroupVersion, addToScheme func(*runtime.Scheme) error) (*rest.RESTClient, error) {
	if rc == nil {
		return nil, errors.New("kuberest: no rest.Config")
	}
	scheme := runtime.NewScheme()
	if err := addToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kuberest: scheme of %s: %w", gv, err)
	}
	c := rest.CopyConfig(rc)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kuberest: client of %s for %s: %w", c.Host, gv, err)
	}
	return client, nil
}

// Object is a pointer to a Kubernetes API type T (for example
// *coordinationv1.Lease for T coordinationv1.Lease).
type Object[T any] interface {
	*T
	runtime.Object
	metav1.Object
}

// Resource is one namespaced resource (for example "leases") of Client,
// whose objects are P. Client's scheme must know P's type.
type Resource[T any, P Object[T]] struct {
	Client rest.Interface
	Name   string
}

// Get reads namespace/name.
func (r Resource[T, P]) Get(ctx context.Context, namespace, name string) (P, error) {
	out := P(new(T))
	if err := r.Client.Get().Namespace(namespace).Resource(r.Name).Name(name).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Create creates obj in its namespace and returns it as the API server
// stored it.
func (r Resource[T, P]) Create(ctx context.Context, obj P) (P, error) {
	out := P(new(T))
	if err := r.Client.Post().Namespace(obj.GetNamespace()).Resource(r.Name).Body(obj).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Update replaces obj (conditioned on its resourceVersion when it has one:
// a stale one fails with a conflict) and returns it as the API server
// stored it.
func (r Resource[T, P]) Update(ctx context.Context, obj P) (P, error) {
	out := P(new(T))
	if err := r.Client.Put().Namespace(obj.GetNamespace()).Resource(r.Name).Name(obj.GetName()).Body(obj).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}
