/* No kernel control-flow integrity in userspace. */
