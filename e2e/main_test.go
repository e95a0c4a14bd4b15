// Package e2e holds natgw's end-to-end scenarios: the whole stack
// as separate processes, real packets, both data planes. See framework/.
package e2e

import (
	"os"
	"testing"

	"github.com/natgw/natgw/e2e/framework"
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m))
}
