package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/platform/store/sqlite"
)

func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "platform")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "platform.db"))
	if err != nil {
		panic(err)
	}
	defer st.Close()
	a, _ := st.CreateAccount(ctx, "alice")
	got, _ := st.AccountByName(ctx, "alice")
	fmt.Println(got.ID == a.ID)
	// Output: true
}
