package apitest

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// RequireAssets returns the envtest assets directory (Assets). When it
// cannot start a control plane, t is skipped with the reason, except as
// root in CI (CI set), where make test builds the assets first: there the
// missing assets fail t.
func RequireAssets(t testing.TB) string {
	t.Helper()
	assets := Assets()
	if why := Missing(assets); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 {
			t.Fatalf("%s (required as root in CI)", why)
		}
		t.Skip("SKIP: " + why)
	}
	return assets
}

// StartT starts env (Start) for t and stops it when t ends.
func StartT(t testing.TB, env *envtest.Environment) *rest.Config {
	t.Helper()
	cfg, err := Start(env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	return cfg
}

// Scheme returns a new scheme of the core kinds and natgw's (t fails if
// one cannot be added).
func Scheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	scheme, err := v1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return scheme
}
