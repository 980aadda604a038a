// Package thread runs work on a locked OS thread that steps have moved
// into a namespace, a cgroup or a jail, and forks processes from it, so a
// child starts where the thread was moved to and the rest of the process
// stays where it is.
package thread
