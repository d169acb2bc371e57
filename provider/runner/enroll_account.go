package runner

// RevokeAccount removes the enrolments of every runner that serves account
// (an account's name, as Enroll records it) from the file at path, and
// returns their names: when an account is deleted, its runners'
// credentials must not serve the next account given its name.
func RevokeAccount(path, account string) ([]string, error) {
	var gone []string
	err := updateRunners(path, func(rf *runnersFile) error {
		kept := rf.Runners[:0]
		for _, e := range rf.Runners {
			if e.Account == account {
				gone = append(gone, e.Name)
				continue
			}
			kept = append(kept, e)
		}
		rf.Runners = kept
		return nil
	})
	return gone, err
}
