package image_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// envPrintEUID makes the test binary print its effective uid and exit:
// the program a test puts in an image as a setuid root file.
const envPrintEUID = "IMAGE_TEST_PRINT_EUID"

func TestMain(m *testing.M) {
	if os.Getenv(envPrintEUID) == "1" {
		fmt.Println(os.Geteuid())
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
