/* The stored record's layout, as copies of cometmq.protocol.record_layout (its owner): the C helpers that write or
 * read records include this, and tests check each helper's copies through its layout(). */
#ifndef COMETMQ_CRECORD_H
#define COMETMQ_CRECORD_H

#define MAGIC_CODE 0xDAA320A7u
#define BORN_HOST_POS 48
#define IPV4_HOST_SIZE 8
#define IPV6_HOST_SIZE 20
#define BORNHOST_V6_FLAG 0x10
#define STOREHOST_V6_FLAG 0x20
#define HOST_V6_FLAGS (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
/* After the born host: STORETIMESTAMP (8), the store host, RECONSUMETIMES (4), PREPAREDTRANSACTIONOFFSET (8),
 * BODYLEN (4), then the body; a record holds a topic length (1) and a properties length (2) more. */
#define BODY_POS(born, store) (BORN_HOST_POS + (born) + 8 + (store) + 16)

#endif
