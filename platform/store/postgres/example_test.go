package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/managoat/managoat/platform/store/postgres"
)

// Open a platform's records on PostgreSQL (the DSN comes from the
// environment: a password never belongs in code or in ps), and take the
// reaper's lease so that one replica reaps at a time.
func ExampleOpen() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("MANAGOAT_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	lease, ok, err := st.TryLease(ctx, "reaper")
	if err != nil {
		log.Fatal(err)
	}
	if !ok {
		fmt.Println("another replica reaps")
		return
	}
	defer lease.Release()
	fmt.Println("this replica reaps")
}
