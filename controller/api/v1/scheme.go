package v1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// NewScheme returns a new scheme of the Kubernetes built-in kinds
// (client-go's) and this package's kinds: what natgw-controller's manager
// and every client of natgw's objects (the tests' and benchmarks' too)
// read and write.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add the Kubernetes built-in kinds to a scheme: %w", err)
	}
	if err := AddToScheme(s); err != nil {
		return nil, fmt.Errorf("add %s kinds to a scheme: %w", GroupVersion, err)
	}
	return s, nil
}
