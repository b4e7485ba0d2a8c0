// Declared by the bundle's banner (see build.mjs): the static page boots the widget through it.
declare var __nnsp: Record<string, unknown> | undefined;
