/* No frame-pointer bookkeeping needed in userspace. */
#define FRAME_BEGIN
#define FRAME_END
#define FRAME_OFFSET 0
