package supervisor

// Followers and the journal's cap. A running session's journal keeps
// only its latest output (Retention.MaxSessionBytes, journal.Writer's
// SetCap), so that a command nobody reads cannot fill the disk. A
// follower that reads slower than the command writes must not lose what
// the cap would drop before it read it: each follower's connection
// tells the supervisor where it is (the wait request, and an "at"
// request every followReport bytes it reads), the journal drops nothing
// from the slowest follower's position on (journal.Writer.SetFloor), and
// while that follower has more than the cap unread, the session's pumps
// stop reading its pipes. The command then blocks on its writes, as on a
// plain pipe to a slow reader: the slowest follower slows the command,
// and loses no byte; the disk holds at most the cap and a batch more. A
// follower that leaves (its connection closes) holds nothing; a session
// nobody follows is capped as before. Once the process exited, the pumps
// hold no more (what its pipes still hold is read within drainGrace).

// followReport is how many bytes a follower reads between the positions
// it reports.
const followReport = 4 << 20

// at records that follower conn is at offset; it reports whether conn
// is new to the session.
func (s *session) at(conn *int, offset int64) bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	_, known := s.readers[conn]
	s.readers[conn] = offset
	s.movedLocked()
	return !known
}

// leave forgets follower conn.
func (s *session) leave(conn *int) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	delete(s.readers, conn)
	s.movedLocked()
}

// movedLocked sets the journal's floor to the slowest follower's
// position and wakes the pumps; under rmu.
func (s *session) movedLocked() {
	floor := int64(-1)
	for _, off := range s.readers {
		if floor < 0 || off < floor {
			floor = off
		}
	}
	s.w.SetFloor(floor)
	close(s.moved)
	s.moved = make(chan struct{})
}

// holdForReaders waits while the slowest follower has more than the
// journal's cap unread (see above).
func (s *session) holdForReaders() {
	if s.capBytes <= 0 {
		return
	}
	for {
		s.rmu.Lock()
		size := s.w.Size()
		behind := false
		for _, off := range s.readers {
			if size-off > s.capBytes {
				behind = true
				break
			}
		}
		moved := s.moved
		s.rmu.Unlock()
		if !behind {
			return
		}
		select {
		case <-moved:
		case <-s.ended:
			return
		}
	}
}
