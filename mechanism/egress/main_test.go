package egress_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}
